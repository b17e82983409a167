package main

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// kstatusOf is what Flux's health checks (kustomize-controller, helm-controller) compute.
func kstatusOf(obj *unstructured.Unstructured) (*Verdict, error) {
	res, err := status.Compute(obj)
	if err != nil {
		return nil, err
	}
	return &Verdict{Status: res.Status.String(), Message: res.Message}, nil
}
