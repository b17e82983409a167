package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		method, target string
		want           request
		ok             bool
	}{
		{"GET", "/api/v1/namespaces/ns/pods", request{"list", "pods", "", false}, true},
		{"GET", "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=1", request{"watch", "pods", "", false}, true},
		{"GET", "/api/v1/watch/namespaces/ns/pods", request{"watch", "pods", "", false}, true},
		{"GET", "/api/v1/namespaces/ns/pods/p", request{"get", "pods", "", false}, true},
		{"DELETE", "/api/v1/namespaces/ns/pods/p", request{"delete", "pods", "", false}, true},
		{"DELETE", "/api/v1/namespaces/ns/pods", request{"deletecollection", "pods", "", false}, true},
		{"PATCH", "/apis/saferollout.dev/v1alpha1/namespaces/ns/saferollouts/sr/status", request{"patch", "saferollouts", "status", false}, true},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", request{"update", "leases", "", false}, true},
		{"POST", "/apis/apps/v1/namespaces/ns/controllerrevisions", request{"create", "controllerrevisions", "", false}, true},
		{"GET", "/api/v1/nodes?watch=1", request{"watch", "nodes", "", false}, true},
		{"PATCH", "/api/v1/nodes/n", request{"patch", "nodes", "", false}, true},
		{"PATCH", "/apis/apps/v1/namespaces/ns/daemonsets/d?dryRun=All", request{"patch", "daemonsets", "", true}, true},
		{"GET", "/api/v1/namespaces/ns", request{"get", "namespaces", "", false}, true},
		{"GET", "/version", request{}, false},
		{"GET", "/apis/resource.k8s.io", request{}, false},
		{"GET", "/apis/resource.k8s.io/v1", request{}, false},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, c.target, nil)
		got, ok := parseRequest(r)
		if ok != c.ok || got != c.want {
			t.Errorf("%s %s: got %+v %v, want %+v %v", c.method, c.target, got, ok, c.want, c.ok)
		}
	}
	q := request{verb: "patch", resource: "saferollouts", sub: "status"}
	if !q.matches("saferollouts") || !q.matches("saferollouts/status") || q.matches("saferollouts/scale") || q.matches("pods") {
		t.Errorf("resource patterns do not match as documented")
	}
}

// fixture: a TLS "API server" behind the fault proxy, and its control API.
type fixture struct {
	proxy, control *httptest.Server
	created        atomic.Int32
	// watches: each watch the upstream serves hands over its channel of
	// events to send (one line each).
	watches chan chan string
}

func newFixture(t *testing.T) *fixture {
	fx := &fixture{watches: make(chan chan string, 4)}
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, _ := parseRequest(r)
		switch q.verb {
		case "watch":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			// Buffered: a send never waits on a watch the proxy let go.
			events := make(chan string, 4)
			fx.watches <- events
			for {
				select {
				case e := <-events:
					fmt.Fprintln(w, e)
					http.NewResponseController(w).Flush()
				case <-r.Context().Done():
					return
				}
			}
		case "create":
			fx.created.Add(1)
			w.WriteHeader(http.StatusCreated)
		default:
			// Echo who the client impersonates.
			fmt.Fprint(w, r.Header.Get("Impersonate-User"))
		}
	}))
	t.Cleanup(upstream.Close)
	up, _ := url.Parse(upstream.URL)
	f := newFaults(1)
	fx.proxy = httptest.NewServer(newProxy(up, upstream.Client().Transport.(*http.Transport), f))
	fx.control = httptest.NewServer(f.controlHandler())
	t.Cleanup(fx.proxy.Close)
	t.Cleanup(fx.control.Close)
	return fx
}

func (fx *fixture) do(t *testing.T, method, path string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, fx.proxy.URL+path, nil)
	req.Header.Set("Impersonate-User", "system:serviceaccount:ns:sa")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func (fx *fixture) ctl(t *testing.T, method, path, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, fx.control.URL+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
}

func (fx *fixture) stats(t *testing.T) stats {
	t.Helper()
	resp, err := http.Get(fx.control.URL + "/faults")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Errors []errorRule `json:"errors"`
		Stats  stats       `json:"stats"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	got.Stats.Requests["rules"] = len(got.Errors)
	return got.Stats
}

func TestForwardsAndInjects(t *testing.T) {
	fx := newFixture(t)
	resp := fx.do(t, "GET", "/api/v1/namespaces/ns/pods/p")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "system:serviceaccount:ns:sa" {
		t.Fatalf("forwarded GET: %d %q (Impersonate-User must pass through)", resp.StatusCode, body)
	}

	// A burst of two 429s on pod reads: the next two, then the rule is spent.
	fx.ctl(t, "POST", "/errors", `{"codes":[429],"fraction":1,"count":2,"verbs":["get"],"resources":["pods"],"retryAfterSeconds":3}`)
	if r := fx.do(t, "GET", "/api/v1/namespaces/ns/configmaps/c"); r.StatusCode != 200 {
		t.Fatalf("another resource was refused: %d", r.StatusCode)
	}
	for i := range 2 {
		r := fx.do(t, "GET", "/api/v1/namespaces/ns/pods/p")
		var status map[string]any
		_ = json.NewDecoder(r.Body).Decode(&status)
		r.Body.Close()
		if r.StatusCode != 429 || r.Header.Get("Retry-After") != "3" || status["reason"] != "TooManyRequests" || status["kind"] != "Status" {
			t.Fatalf("burst answer %d: %d Retry-After %q %v", i, r.StatusCode, r.Header.Get("Retry-After"), status)
		}
	}
	if r := fx.do(t, "GET", "/api/v1/namespaces/ns/pods/p"); r.StatusCode != 200 {
		t.Fatalf("after the burst: %d", r.StatusCode)
	}

	// A rule for dry runs only leaves the real request alone.
	fx.ctl(t, "POST", "/errors", `{"codes":[500],"fraction":1,"count":1,"verbs":["patch"],"dryRun":true}`)
	if r := fx.do(t, "PATCH", "/api/v1/nodes/n"); r.StatusCode != 200 {
		t.Fatalf("a real patch was refused by a dry-run rule: %d", r.StatusCode)
	}
	if r := fx.do(t, "PATCH", "/api/v1/nodes/n?dryRun=All"); r.StatusCode != 500 {
		t.Fatalf("the dry run was not refused: %d", r.StatusCode)
	}

	// "after": the create reaches the API server, its answer is lost.
	fx.ctl(t, "POST", "/errors", `{"codes":[500],"fraction":1,"count":1,"verbs":["create"],"after":true}`)
	if r := fx.do(t, "POST", "/api/v1/namespaces/ns/pods"); r.StatusCode != 500 {
		t.Fatalf("create with its answer replaced: %d", r.StatusCode)
	}
	if fx.created.Load() != 1 {
		t.Fatalf("the create did not reach the API server")
	}
	st := fx.stats(t)
	if st.Injected["429"] != 2 || st.Injected["500"] != 2 || st.InjectedBy["get pods"] != 2 || st.Requests["rules"] != 0 {
		t.Fatalf("stats: %+v", st)
	}

	// Invalid rules are refused.
	for _, bad := range []string{`{"codes":[404],"fraction":1}`, `{"codes":[500],"fraction":0}`, `{"codes":[500],"fraction":1,"verb":["get"]}`} {
		req, _ := http.NewRequest("POST", fx.control.URL+"/errors", strings.NewReader(bad))
		r, err := http.DefaultClient.Do(req)
		if err != nil || r.StatusCode != 400 {
			t.Fatalf("rule %s accepted", bad)
		}
		r.Body.Close()
	}
}

// upstreamWatch is the next watch the upstream serves.
func (fx *fixture) upstreamWatch(t *testing.T) chan string {
	t.Helper()
	select {
	case w := <-fx.watches:
		return w
	case <-time.After(5 * time.Second):
		t.Fatal("no watch reached the upstream")
		return nil
	}
}

// lines reads a stream's lines onto a channel.
func lines(body io.Reader) <-chan string {
	out := make(chan string, 16)
	go func() {
		s := bufio.NewScanner(body)
		for s.Scan() {
			out <- s.Text()
		}
		close(out)
	}()
	return out
}

func TestWatchesStreamAndGoSilent(t *testing.T) {
	fx := newFixture(t)
	resp := fx.do(t, "GET", "/api/v1/namespaces/ns/pods?watch=true")
	defer resp.Body.Close()
	got := lines(resp.Body)
	first := fx.upstreamWatch(t)
	// Each event comes through as it is sent, not when the stream ends.
	first <- "one"
	select {
	case l := <-got:
		if l != "one" {
			t.Fatalf("got %q", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the event was not streamed through")
	}

	fx.ctl(t, "PUT", "/blackhole", `{"resources":["pods"]}`)
	// Sent by the upstream if the proxy still reads it; dropped either way.
	first <- "two"
	// A new watch of pods gets its headers and nothing after.
	held := fx.do(t, "GET", "/api/v1/watch/namespaces/ns/pods")
	defer held.Body.Close()
	if held.StatusCode != 200 {
		t.Fatalf("held watch: %d", held.StatusCode)
	}
	heldLines := lines(held.Body)
	// Lifted: new watches pass, the silenced ones stay silent.
	fx.ctl(t, "DELETE", "/blackhole", "")
	fresh := fx.do(t, "GET", "/api/v1/namespaces/ns/pods?watch=1")
	defer fresh.Body.Close()
	freshLines := lines(fresh.Body)
	// The held watch never reached the upstream: the next one is the fresh one.
	fx.upstreamWatch(t) <- "three"
	select {
	case l := <-freshLines:
		if l != "three" {
			t.Fatalf("fresh watch got %q", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a watch after the blackhole was lifted got nothing")
	}
	// What the silenced and the held watches got by now: nothing (both are
	// still open, so their channels are neither closed nor filled).
	select {
	case l, open := <-got:
		t.Fatalf("the silenced watch delivered %q (open %v)", l, open)
	case l, open := <-heldLines:
		t.Fatalf("the held watch delivered %q (open %v)", l, open)
	default:
	}
	if st := fx.stats(t); st.Blackholed != 2 {
		t.Fatalf("blackholed: %d, want 2", st.Blackholed)
	}
}
