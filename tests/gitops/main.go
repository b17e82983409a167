// Command gitops-check judges SafeRollout objects the way GitOps tools do:
// saferollout's Argo CD health check (Lua) run in a VM set up exactly like
// Argo CD's (github.com/yuin/gopher-lua with the libraries Argo CD opens for
// a custom health check), and Flux's kstatus (sigs.k8s.io/cli-utils).
//
//	gitops-check -lua deploy/argocd/health.lua OBJECT.json...
//
// Prints one JSON line per object:
//
//	{"file":"...","name":"ns/name","phase":"...","argocd":{"status":"...","message":"..."},"kstatus":{"status":"...","message":"..."}}
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Result is one object's verdicts.
type Result struct {
	File    string  `json:"file"`
	Name    string  `json:"name"`
	Phase   string  `json:"phase"`
	ArgoCD  Verdict `json:"argocd"`
	KStatus Verdict `json:"kstatus"`
}

// Verdict is a tool's status and message for an object.
type Verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	luaPath := flag.String("lua", "", "the Argo CD health check (Lua) to run")
	flag.Parse()
	if *luaPath == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: gitops-check -lua HEALTH.lua OBJECT.json...")
		os.Exit(2)
	}
	script, err := os.ReadFile(*luaPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, path := range flag.Args() {
		res, err := check(path, string(script))
		if err != nil {
			fmt.Fprintf(os.Stderr, "error: %s: %v\n", path, err)
			os.Exit(1)
		}
		if err := out.Encode(res); err != nil {
			fmt.Fprintf(os.Stderr, "error: %v\n", err)
			os.Exit(1)
		}
	}
}

func check(path, script string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	obj, err := decode(data)
	if err != nil {
		return nil, err
	}
	argo, err := argoHealth(obj, script)
	if err != nil {
		return nil, fmt.Errorf("argo cd health check: %w", err)
	}
	kst, err := kstatusOf(obj)
	if err != nil {
		return nil, fmt.Errorf("kstatus: %w", err)
	}
	phase, _, _ := unstructured.NestedString(obj.Object, "status", "phase")
	return &Result{
		File:    path,
		Name:    obj.GetNamespace() + "/" + obj.GetName(),
		Phase:   phase,
		ArgoCD:  *argo,
		KStatus: *kst,
	}, nil
}

// decode reads an object as Argo CD's and Flux's caches hold it: unstructured,
// with integers as int64.
func decode(data []byte) (*unstructured.Unstructured, error) {
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		return nil, err
	}
	return obj, nil
}
