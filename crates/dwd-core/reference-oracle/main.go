// Command oracle loads config files with the reference's own loaders (dependency-watchdog v1.7.0,
// copied verbatim into ./ref by sync.sh) and prints, per file, one JSON line saying whether the
// reference accepts it (with the effective values after its defaulting), rejects it (with its
// error) or panics. dwd-core's parity test compares these lines with its table's "reference"
// column, so the column is checked against the reference's code instead of being read off it.
//
// Usage: oracle prober|weeder FILE...
package main

import (
	"encoding/json"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	papi "dwd-reference-oracle/ref/api/prober"
	"dwd-reference-oracle/ref/intern/prober"
	"dwd-reference-oracle/ref/intern/weeder"
)

type scaleInfo struct {
	Level        int   `json:"level"`
	InitialDelay int64 `json:"initialDelay"`
	Timeout      int64 `json:"timeout"`
}

type resourceInfo struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	Name       string    `json:"name"`
	Optional   bool      `json:"optional"`
	ScaleUp    scaleInfo `json:"scaleUp"`
	ScaleDown  scaleInfo `json:"scaleDown"`
}

// Durations are nanoseconds (Go's time.Duration), so negative values survive.
type proberOut struct {
	KubeConfigSecretName        string         `json:"kubeConfigSecretName"`
	ProbeInterval               int64          `json:"probeInterval"`
	InitialDelay                int64          `json:"initialDelay"`
	ProbeTimeout                int64          `json:"probeTimeout"`
	BackoffJitterFactor         float64        `json:"backoffJitterFactor"`
	KCMNodeMonitorGraceDuration int64          `json:"kcmNodeMonitorGraceDuration"`
	NodeLeaseFailureFraction    float64        `json:"nodeLeaseFailureFraction"`
	DependentResourceInfos      []resourceInfo `json:"dependentResourceInfos"`
}

// A selector as the weeder's pod watch uses it: LabelSelectorAsSelector(s).String(); Nil marks a
// null list entry (labels.Nothing(), whose String() is "" too).
type selectorOut struct {
	Query string `json:"query"`
	Nil   bool   `json:"nil"`
}

type weederOut struct {
	WatchDuration int64                    `json:"watchDuration"`
	Services      map[string][]selectorOut `json:"services"`
}

type result struct {
	File    string     `json:"file"`
	Outcome string     `json:"outcome"` // accepted | rejected | panic
	Error   string     `json:"error,omitempty"`
	Prober  *proberOut `json:"prober,omitempty"`
	Weeder  *weederOut `json:"weeder,omitempty"`
}

func scale(s *papi.ScaleInfo) scaleInfo {
	return scaleInfo{Level: s.Level, InitialDelay: int64(s.InitialDelay.Duration), Timeout: int64(s.Timeout.Duration)}
}

func loadProber(file string) (r result) {
	r.File = file
	defer func() {
		if p := recover(); p != nil {
			r = result{File: file, Outcome: "panic", Error: fmt.Sprint(p)}
		}
	}()
	// The reference validates apiVersion/kind against its scheme but ignores the answer, so an
	// empty scheme gives the same result as its full one.
	c, err := prober.LoadConfig(file, runtime.NewScheme())
	if err != nil {
		return result{File: file, Outcome: "rejected", Error: err.Error()}
	}
	out := &proberOut{
		KubeConfigSecretName:        c.KubeConfigSecretName,
		ProbeInterval:               int64(c.ProbeInterval.Duration),
		InitialDelay:                int64(c.InitialDelay.Duration),
		ProbeTimeout:                int64(c.ProbeTimeout.Duration),
		BackoffJitterFactor:         *c.BackoffJitterFactor,
		KCMNodeMonitorGraceDuration: int64(c.KCMNodeMonitorGraceDuration.Duration),
		NodeLeaseFailureFraction:    *c.NodeLeaseFailureFraction,
		DependentResourceInfos:      []resourceInfo{},
	}
	for _, i := range c.DependentResourceInfos {
		out.DependentResourceInfos = append(out.DependentResourceInfos, resourceInfo{
			APIVersion: i.Ref.APIVersion, Kind: i.Ref.Kind, Name: i.Ref.Name, Optional: i.Optional,
			ScaleUp: scale(i.ScaleUpInfo), ScaleDown: scale(i.ScaleDownInfo),
		})
	}
	return result{File: file, Outcome: "accepted", Prober: out}
}

func loadWeeder(file string) (r result) {
	r.File = file
	defer func() {
		if p := recover(); p != nil {
			r = result{File: file, Outcome: "panic", Error: fmt.Sprint(p)}
		}
	}()
	c, err := weeder.LoadConfig(file)
	if err != nil {
		return result{File: file, Outcome: "rejected", Error: err.Error()}
	}
	out := &weederOut{WatchDuration: int64(c.WatchDuration.Duration), Services: map[string][]selectorOut{}}
	for name, ds := range c.ServicesAndDependantSelectors {
		sels := []selectorOut{}
		for _, ps := range ds.PodSelectors {
			s, err := metav1.LabelSelectorAsSelector(ps)
			if err != nil { // validated by LoadConfig; kept for completeness
				return result{File: file, Outcome: "rejected", Error: err.Error()}
			}
			sels = append(sels, selectorOut{Query: s.String(), Nil: ps == nil})
		}
		out.Services[name] = sels
	}
	return result{File: file, Outcome: "accepted", Weeder: out}
}

func main() {
	if len(os.Args) < 3 || (os.Args[1] != "prober" && os.Args[1] != "weeder") {
		fmt.Fprintln(os.Stderr, "usage: oracle prober|weeder FILE...")
		os.Exit(2)
	}
	enc := json.NewEncoder(os.Stdout)
	for _, f := range os.Args[2:] {
		var r result
		if os.Args[1] == "prober" {
			r = loadProber(f)
		} else {
			r = loadWeeder(f)
		}
		if err := enc.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
