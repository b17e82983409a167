// Command controlplane is one multi-call binary holding the real Kubernetes
// control-plane components, built from the official Go modules, so tests can
// run a real cluster on machines without container images or release downloads.
//
// The component is chosen by the first argument (or by the name the binary is
// invoked as, so symlinks named kube-apiserver etc. work too):
//
//	controlplane kube-apiserver --etcd-servers=...
//	controlplane kube-controller-manager ...
//	controlplane kube-scheduler ...
//	controlplane etcd --data-dir=...
//	controlplane kubectl get nodes
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// components maps a component name to its entry point. Each entry point reads
// its own flags from os.Args[1:], exactly as the upstream binary does.
var components = map[string]func() int{
	"kube-apiserver":          runAPIServer,
	"kube-controller-manager": runControllerManager,
	"kube-scheduler":          runScheduler,
	"kubectl":                 runKubectl,
	"etcd":                    runEtcd,
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok {
		if len(os.Args) < 2 {
			usage()
			os.Exit(2)
		}
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	run, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "controlplane: unknown component %q\n", name)
		usage()
		os.Exit(2)
	}
	os.Exit(run())
}

func usage() {
	names := make([]string, 0, len(components))
	for n := range components {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: controlplane <component> [flags]\ncomponents: %v\n", names)
}
