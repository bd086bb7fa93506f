//go:build tools

// Package tools records the main packages this module builds, so that
// `go mod tidy` keeps every module they need in go.sum.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
