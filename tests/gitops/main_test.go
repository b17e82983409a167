package main

import (
	"os"
	"strings"
	"testing"
)

// The live phases are checked by crates/operator/tests/gitops.rs on objects
// captured from the operator; these are the cases a running operator never
// leaves behind for long, and the VM's own guarantees.

func healthScript(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../deploy/argocd/health.lua")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func mustDecode(t *testing.T, text string) *Verdict {
	t.Helper()
	obj, err := decode([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	v, err := argoHealth(obj, healthScript(t))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestNoStatusIsProgressing(t *testing.T) {
	v := mustDecode(t, `{"apiVersion":"saferollout.dev/v1alpha1","kind":"SafeRollout",
		"metadata":{"name":"p","namespace":"gpu","generation":1},"spec":{"targetRef":{"name":"p"}}}`)
	if v.Status != "Progressing" || !strings.Contains(v.Message, "reconcile") {
		t.Fatalf("got %+v", v)
	}
}

func TestUnobservedGenerationIsProgressing(t *testing.T) {
	v := mustDecode(t, `{"apiVersion":"saferollout.dev/v1alpha1","kind":"SafeRollout",
		"metadata":{"name":"p","namespace":"gpu","generation":3},"spec":{"targetRef":{"name":"p"}},
		"status":{"observedGeneration":2,"phase":"Succeeded",
		  "conditions":[{"type":"Ready","status":"True","reason":"Succeeded","message":"done","lastTransitionTime":"2025-01-01T00:00:00Z"}]}}`)
	if v.Status != "Progressing" || v.Message != "Waiting for the saferollout operator to observe generation 3" {
		t.Fatalf("got %+v", v)
	}
}

// A script that reaches for a library Argo CD does not open fails, as it
// would in Argo CD: proof the VM is not more permissive than the real one.
func TestStringLibraryIsAbsent(t *testing.T) {
	obj, err := decode([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = argoHealth(obj, `return {status = string.upper("healthy")}`)
	if err == nil {
		t.Fatal("string library available")
	}
	v, err := argoHealth(obj, `return {status = "Fine", message = "x"}`)
	if err != nil || v.Status != "Unknown" {
		t.Fatalf("an invalid status is Unknown, got %+v, %v", v, err)
	}
}

func TestKstatusReadsStalledAndReconciling(t *testing.T) {
	for _, tc := range []struct{ cond, want string }{
		{"Stalled", "Failed"},
		{"Reconciling", "InProgress"},
	} {
		obj, err := decode([]byte(`{"apiVersion":"saferollout.dev/v1alpha1","kind":"SafeRollout",
			"metadata":{"name":"p","namespace":"gpu","generation":1},
			"status":{"observedGeneration":1,"conditions":[{"type":"` + tc.cond + `","status":"True","reason":"R","message":"m"}]}}`))
		if err != nil {
			t.Fatal(err)
		}
		v, err := kstatusOf(obj)
		if err != nil || v.Status != tc.want {
			t.Fatalf("%s: got %+v, %v", tc.cond, v, err)
		}
	}
}
