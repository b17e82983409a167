// Command faultproxy is the HTTP-aware half of the fault tests' proxy (the
// TCP half is Toxiproxy): a reverse proxy that listens in plain HTTP on
// loopback and forwards to the test cluster's kube-apiserver over TLS with
// the admin's client certificate, passing every header through, the
// Impersonate-* headers included, so a client behind it still acts as the
// user it impersonates and RBAC still applies.
//
// Between the two it injects what an API server under load or in trouble
// answers, changed at run time through a loopback control API (plain JSON
// over HTTP):
//
//   - error rules: answer 429 (with Retry-After), 500, 503, 504 or 409 to
//     a chosen fraction of the requests of chosen verbs and resources, or to
//     the next N of them (a burst); with "after", the request is forwarded
//     first and the API server's answer replaced (the write happened, its
//     answer was lost);
//   - blackholed watches: watches of a chosen resource go silent and stay
//     open. New ones get their headers and nothing after; open ones deliver
//     nothing more. A silenced stream never speaks again, even once the
//     blackhole is lifted, as a dead connection would not: its client has to
//     notice by itself and watch again.
//
// Control API (on --control):
//
//	GET    /faults     the rules, the blackholed resources and the counters
//	POST   /errors     add an error rule (JSON, see errorRule)
//	DELETE /errors     remove every error rule
//	PUT    /blackhole  {"resources": ["pods", ...]}: blackhole these watches
//	DELETE /blackhole  new watches pass again
//	POST   /clear      remove every rule and lift the blackhole
//
// The first line on stdout names both addresses, for the process that
// started it: "faultproxy proxy=127.0.0.1:P control=127.0.0.1:C".
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address of the proxy (plain HTTP, loopback only)")
	control := flag.String("control", "127.0.0.1:0", "address of the control API (loopback only)")
	upstream := flag.String("upstream", "", "the API server's URL (https, loopback only)")
	caFile := flag.String("ca", "", "the API server's CA certificate (PEM)")
	certFile := flag.String("cert", "", "the client certificate the proxy presents (PEM)")
	keyFile := flag.String("key", "", "its key (PEM)")
	seed := flag.Uint64("seed", 0, "seed of the fault draws (0: a random one, logged)")
	flag.Parse()

	up, err := url.Parse(*upstream)
	if err != nil || up.Scheme != "https" || !loopbackHost(up.Hostname()) {
		log.Fatalf("--upstream must be an https URL on loopback, not %q", *upstream)
	}
	for _, a := range []string{*listen, *control} {
		host, _, err := net.SplitHostPort(a)
		if err != nil || !loopbackHost(host) {
			log.Fatalf("listen addresses must be on loopback, not %q", a)
		}
	}
	transport, err := upstreamTransport(*caFile, *certFile, *keyFile)
	if err != nil {
		log.Fatal(err)
	}
	if *seed == 0 {
		*seed = rand.Uint64()
	}
	log.Printf("fault draws seeded with %d", *seed)
	f := newFaults(*seed)

	proxyLn, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	controlLn, err := net.Listen("tcp", *control)
	if err != nil {
		log.Fatal(err)
	}
	proxy := &http.Server{Handler: newProxy(up, transport, f), ReadHeaderTimeout: 30 * time.Second}
	ctl := &http.Server{Handler: f.controlHandler(), ReadHeaderTimeout: 30 * time.Second}
	go func() { log.Fatal(proxy.Serve(proxyLn)) }()
	go func() { log.Fatal(ctl.Serve(controlLn)) }()
	fmt.Printf("faultproxy proxy=%s control=%s\n", proxyLn.Addr(), controlLn.Addr())
	os.Stdout.Sync()

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	// Held watches end with the process: nothing to drain.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = ctl.Shutdown(ctx)
	_ = proxy.Close()
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// upstreamTransport speaks TLS (HTTP/2 where the API server offers it) to
// the API server with the given client certificate.
func upstreamTransport(caFile, certFile, keyFile string) (*http.Transport, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca: no certificate in %s", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--cert/--key: %w", err)
	}
	return &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}, nil
}

// request is what the fault rules match on: the Kubernetes verb and the
// resource ("pods", or "pods/status" for a subresource) of an API request,
// and whether it is a dry run.
type request struct {
	verb     string
	resource string
	sub      string
	dryRun   bool
}

// parseRequest reads the verb and resource of a resource request as the API
// server's RequestInfo does. ok is false for anything else (discovery,
// /version, /healthz), which no rule touches.
func parseRequest(r *http.Request) (request, bool) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return request{}, false
	}
	watch := false
	if len(parts) > 0 && parts[0] == "watch" {
		watch, parts = true, parts[1:]
	}
	// namespaces/NS/RESOURCE/...; a namespace itself is namespaces/NAME.
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	if len(parts) == 0 || parts[0] == "" {
		return request{}, false
	}
	req := request{resource: parts[0]}
	named := len(parts) >= 2
	if len(parts) >= 3 {
		req.sub = parts[2]
	}
	if w := r.URL.Query().Get("watch"); w == "true" || w == "1" {
		watch = true
	}
	req.dryRun = r.URL.Query().Get("dryRun") != ""
	switch r.Method {
	case http.MethodGet:
		switch {
		case watch:
			req.verb = "watch"
		case named:
			req.verb = "get"
		default:
			req.verb = "list"
		}
	case http.MethodPost:
		req.verb = "create"
	case http.MethodPut:
		req.verb = "update"
	case http.MethodPatch:
		req.verb = "patch"
	case http.MethodDelete:
		if named {
			req.verb = "delete"
		} else {
			req.verb = "deletecollection"
		}
	default:
		req.verb = strings.ToLower(r.Method)
	}
	return req, true
}

// matches tells whether a resource pattern names this request's resource:
// "pods" matches pods and its subresources, "pods/status" only that one.
func (q request) matches(pattern string) bool {
	res, sub, hasSub := strings.Cut(pattern, "/")
	if res != q.resource {
		return false
	}
	return !hasSub || sub == q.sub
}

// errorRule answers some requests with an error instead of the API server.
type errorRule struct {
	// Codes: each injected answer takes one of them at random (409, 429,
	// 500, 503, 504).
	Codes []int `json:"codes"`
	// Fraction of the matching requests answered with an error (0 < f <= 1).
	Fraction float64 `json:"fraction"`
	// Count > 0: only the next Count matching requests drawn are answered
	// with an error, then the rule is spent (a burst).
	Count int `json:"count,omitempty"`
	// Verbs (get, list, watch, create, update, patch, delete,
	// deletecollection); empty: every verb.
	Verbs []string `json:"verbs,omitempty"`
	// Resources ("pods", "saferollouts/status"); empty: every resource.
	Resources []string `json:"resources,omitempty"`
	// DryRun: true, only dry runs (?dryRun=All); false, only real
	// requests; unset: both.
	DryRun *bool `json:"dryRun,omitempty"`
	// RetryAfterSeconds of a 429 (its Retry-After header and the Status's
	// retryAfterSeconds); 0: 1 s.
	RetryAfterSeconds int `json:"retryAfterSeconds,omitempty"`
	// After: forward the request, then replace the API server's answer with
	// the error (never for watches, whose answer is a stream).
	After bool `json:"after,omitempty"`

	// Injected counts the answers this rule replaced.
	Injected int `json:"injected"`
}

var statusReason = map[int]string{
	http.StatusConflict:            "Conflict",
	http.StatusTooManyRequests:     "TooManyRequests",
	http.StatusInternalServerError: "InternalError",
	http.StatusServiceUnavailable:  "ServiceUnavailable",
	http.StatusGatewayTimeout:      "Timeout",
}

func (e *errorRule) validate() error {
	if len(e.Codes) == 0 {
		return errors.New("codes: at least one")
	}
	for _, c := range e.Codes {
		if _, ok := statusReason[c]; !ok {
			return fmt.Errorf("codes: %d is not one of 409, 429, 500, 503, 504", c)
		}
	}
	if !(e.Fraction > 0 && e.Fraction <= 1) {
		return fmt.Errorf("fraction: %v is not in (0, 1]", e.Fraction)
	}
	if e.Count < 0 || e.RetryAfterSeconds < 0 {
		return errors.New("count and retryAfterSeconds are not negative")
	}
	e.Injected = 0
	return nil
}

func (e *errorRule) applies(q request) bool {
	if len(e.Verbs) > 0 && !slices.Contains(e.Verbs, q.verb) {
		return false
	}
	if e.After && q.verb == "watch" {
		return false
	}
	if e.DryRun != nil && *e.DryRun != q.dryRun {
		return false
	}
	return len(e.Resources) == 0 || slices.ContainsFunc(e.Resources, q.matches)
}

// faults is the state the control API changes and the proxy reads.
type faults struct {
	mu        sync.Mutex
	rng       *rand.Rand
	rules     []*errorRule
	blackhole []string
	// open watch streams, silenced the moment their resource is
	// blackholed (not at their next read, which may come after the
	// blackhole was lifted).
	open  map[*silenceable]struct{}
	stats stats
}

type stats struct {
	// Requests by verb ("other" for non-resource requests).
	Requests map[string]int `json:"requests"`
	// Injected error answers by code.
	Injected map[string]int `json:"injected"`
	// InjectedBy verb and resource ("patch pods": 3).
	InjectedBy map[string]int `json:"injectedBy"`
	// Watches blackholed: held silent from the start, or silenced open.
	Blackholed int `json:"blackholed"`
}

func newFaults(seed uint64) *faults {
	return &faults{
		rng:  rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		open: map[*silenceable]struct{}{},
		stats: stats{
			Requests:   map[string]int{},
			Injected:   map[string]int{},
			InjectedBy: map[string]int{},
		},
	}
}

// injection is an error to answer with.
type injection struct {
	code       int
	retryAfter int
	after      bool
}

// draw counts the request and decides whether an error rule answers it:
// the first rule that applies and whose draw hits.
func (f *faults) draw(q request, ok bool) *injection {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !ok {
		f.stats.Requests["other"]++
		return nil
	}
	f.stats.Requests[q.verb]++
	for i, rule := range f.rules {
		if !rule.applies(q) || f.rng.Float64() >= rule.Fraction {
			continue
		}
		code := rule.Codes[f.rng.IntN(len(rule.Codes))]
		rule.Injected++
		if rule.Count > 0 && rule.Injected >= rule.Count {
			f.rules = slices.Delete(f.rules, i, i+1)
		}
		f.stats.Injected[strconv.Itoa(code)]++
		name := q.resource
		if q.sub != "" {
			name += "/" + q.sub
		}
		if q.dryRun {
			name += " (dry run)"
		}
		f.stats.InjectedBy[q.verb+" "+name]++
		retry := rule.RetryAfterSeconds
		if retry == 0 {
			retry = 1
		}
		return &injection{code: code, retryAfter: retry, after: rule.After}
	}
	return nil
}

func (f *faults) blackholed(q request) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.blackhole, q.matches)
}

func (f *faults) countBlackholed() {
	f.mu.Lock()
	f.stats.Blackholed++
	f.mu.Unlock()
}

// track registers an open watch stream; it is silenced at once if its
// resource was blackholed meanwhile.
func (f *faults) track(s *silenceable) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open[s] = struct{}{}
	f.silenceLocked()
}

func (f *faults) untrack(s *silenceable) {
	f.mu.Lock()
	delete(f.open, s)
	f.mu.Unlock()
}

// silenceLocked silences the open streams of the blackholed resources.
func (f *faults) silenceLocked() {
	for s := range f.open {
		if slices.ContainsFunc(f.blackhole, s.q.matches) && !s.silenced.Swap(true) {
			f.stats.Blackholed++
			log.Printf("blackhole (silenced open) watch of %s", s.q.resource)
		}
	}
}

func (f *faults) controlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{
			"errors":    f.rules,
			"blackhole": f.blackhole,
			"stats":     f.stats,
		})
	})
	mux.HandleFunc("POST /errors", func(w http.ResponseWriter, r *http.Request) {
		var rule errorRule
		if err := decodeStrict(r.Body, &rule); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		if err := rule.validate(); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		f.mu.Lock()
		f.rules = append(f.rules, &rule)
		f.mu.Unlock()
		log.Printf("control: error rule %+v", rule)
		writeJSON(w, http.StatusCreated, rule)
	})
	mux.HandleFunc("DELETE /errors", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		f.rules = nil
		f.mu.Unlock()
		log.Printf("control: error rules removed")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("PUT /blackhole", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Resources []string `json:"resources"`
		}
		if err := decodeStrict(r.Body, &body); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		sort.Strings(body.Resources)
		f.mu.Lock()
		f.blackhole = body.Resources
		f.silenceLocked()
		f.mu.Unlock()
		log.Printf("control: blackholed watches of %v", body.Resources)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /blackhole", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		f.blackhole = nil
		f.mu.Unlock()
		log.Printf("control: blackhole lifted")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /clear", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		f.rules, f.blackhole = nil, nil
		f.mu.Unlock()
		log.Printf("control: cleared")
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func decodeStrict(r io.Reader, v any) error {
	d := json.NewDecoder(r)
	d.DisallowUnknownFields()
	return d.Decode(v)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeStatus answers as the API server would: a metav1.Status.
func writeStatus(w http.ResponseWriter, in *injection, q request) {
	reason := statusReason[in.code]
	status := map[string]any{
		"kind":       "Status",
		"apiVersion": "v1",
		"metadata":   map[string]any{},
		"status":     "Failure",
		"message":    fmt.Sprintf("faultproxy: injected %d for %s %s", in.code, q.verb, q.resource),
		"reason":     reason,
		"code":       in.code,
	}
	switch in.code {
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", strconv.Itoa(in.retryAfter))
		status["details"] = map[string]any{"retryAfterSeconds": in.retryAfter}
		status["message"] = "faultproxy: too many requests, please try again later"
	case http.StatusConflict:
		status["message"] = "faultproxy: the object has been modified; please apply your changes to the latest version and try again"
	}
	writeJSON(w, in.code, status)
}

type ctxKey struct{}

func newProxy(up *url.URL, transport *http.Transport, f *faults) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
		},
		Transport: transport,
		// Watches are streams: every chunk goes out as it comes.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if q, ok := resp.Request.Context().Value(ctxKey{}).(request); ok && q.verb == "watch" {
				s := &silenceable{body: resp.Body, q: q, f: f, done: resp.Request.Context().Done()}
				f.track(s)
				resp.Body = s
			}
			return nil
		},
		ErrorLog: log.Default(),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, ok := parseRequest(r)
		if in := f.draw(q, ok); in != nil {
			if in.after {
				forwardAndDrop(r, up, transport)
			}
			log.Printf("inject %d %s %s (after=%v)", in.code, r.Method, r.URL.RequestURI(), in.after)
			writeStatus(w, in, q)
			return
		}
		if ok && q.verb == "watch" && f.blackholed(q) {
			f.countBlackholed()
			log.Printf("blackhole (held silent) %s", r.URL.RequestURI())
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			<-r.Context().Done()
			return
		}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, q)))
	})
}

// forwardAndDrop sends the request to the API server and throws its answer
// away.
func forwardAndDrop(r *http.Request, up *url.URL, transport *http.Transport) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host, out.Host = up.Scheme, up.Host, up.Host
	for _, h := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		out.Header.Del(h)
	}
	resp, err := transport.RoundTrip(out)
	if err != nil {
		log.Printf("forward (answer to be dropped) %s: %v", r.URL.RequestURI(), err)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
}

// silenceable is a watch's body from the API server that goes silent for
// good once its resource is blackholed: what it reads after that is dropped
// and the stream is held open, without a byte more, until the client leaves.
type silenceable struct {
	body     io.ReadCloser
	q        request
	f        *faults
	done     <-chan struct{}
	silenced atomic.Bool
	closed   bool
}

func (s *silenceable) Read(p []byte) (int, error) {
	if !s.silenced.Load() {
		n, err := s.body.Read(p)
		// Read while the blackhole was set: dropped.
		if !s.silenced.Load() {
			return n, err
		}
	}
	if !s.closed {
		s.closed = true
		_ = s.body.Close()
	}
	<-s.done
	return 0, context.Canceled
}

func (s *silenceable) Close() error {
	s.f.untrack(s)
	return s.body.Close()
}
