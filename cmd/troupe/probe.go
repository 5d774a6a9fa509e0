package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/troupe/troupe/gpu/cuda"
	"github.com/troupe/troupe/xgmi"
)

// probeResult is what probe prints with --json.
type probeResult struct {
	Host probeTopology `json:"host"`
	CUDA probeTopology `json:"cuda"`
}

type probeTopology struct {
	Fabric  string      `json:"fabric"`
	Devices []string    `json:"devices"`
	Links   []probeLink `json:"links"`
	Note    string      `json:"note,omitempty"`
}

type probeLink struct {
	A    int    `json:"a"`
	B    int    `json:"b"`
	Kind string `json:"kind"`
}

func toProbeTopology(t xgmi.Topology) probeTopology {
	p := probeTopology{Fabric: t.Fabric, Devices: t.Devices, Links: []probeLink{}, Note: t.Note}
	if p.Devices == nil {
		p.Devices = []string{}
	}
	for _, l := range t.Links {
		p.Links = append(p.Links, probeLink{A: l.A, B: l.B, Kind: l.Kind.String()})
	}
	return p
}

func cmdProbe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("probe", stderr)
	ranks := fs.Int("ranks", 2, "ranks of the host fabric to describe")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := xgmi.DefaultHostFabricConfig()
	cfg.Ranks = *ranks
	f, err := xgmi.NewHostFabric(cfg)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer f.Close()
	host := xgmi.ProbeFabric("host", f)
	host.Note = fmt.Sprintf("goroutines of one process, %d MiB windows", cfg.WindowBytes>>20)
	gpus := probeCUDA(ctx)
	if *asJSON {
		return json.NewEncoder(stdout).Encode(probeResult{Host: toProbeTopology(host), CUDA: toProbeTopology(gpus)})
	}
	if err := host.Write(stdout); err != nil {
		return err
	}
	return gpus.Write(stdout)
}

// probeCUDA describes the CUDA devices of this host, or says why there
// are none.
func probeCUDA(ctx context.Context) xgmi.Topology {
	peers, err := openCUDAPeers(ctx)
	if err != nil {
		return xgmi.Topology{Fabric: "cuda", Note: "no GPUs: " + err.Error()}
	}
	defer peers.Close()
	t, err := xgmi.ProbePeers("cuda", peers)
	if err != nil {
		t.Note = err.Error()
	} else if peers.stopped != nil {
		t.Note = "probe stopped at: " + peers.stopped.Error()
	}
	return t
}

// cudaPeers adapts the open CUDA devices of this host to xgmi.Peers.
type cudaPeers struct {
	devs    []*cuda.Device
	stopped error // why the probe opened no more devices
}

// maxCUDADevices bounds the devices a probe opens.
const maxCUDADevices = 64

// openCUDAPeers opens every visible GPU; it fails when the first cannot be
// opened (no driver, no GPU), with cuda.Open's reason.
func openCUDAPeers(ctx context.Context) (*cudaPeers, error) {
	p := &cudaPeers{}
	for i := range maxCUDADevices {
		d, err := cuda.Open(ctx, cudaConfig(i))
		if err != nil {
			if i == 0 {
				return nil, err
			}
			p.stopped = err
			break
		}
		p.devs = append(p.devs, d)
	}
	return p, nil
}

func (p *cudaPeers) Count() int { return len(p.devs) }

func (p *cudaPeers) Name(i int) string {
	info := p.devs[i].Info()
	return fmt.Sprintf("cuda:%d %s (sm_%d%d, %d SMs, %.0f GiB)", info.Ordinal, info.Name, info.ComputeMajor, info.ComputeMinor, info.SMs, float64(info.MemBytes)/(1<<30))
}

func (p *cudaPeers) CanAccessPeer(a, b int) (bool, error) {
	return p.devs[a].CanAccessPeer(p.devs[b])
}

// Close closes every device, returning the first error.
func (p *cudaPeers) Close() error {
	var first error
	for _, d := range p.devs {
		if err := d.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
