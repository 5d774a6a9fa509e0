package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/troupe/troupe/models/demo"
)

// BenchmarkServeStreams measures the served demo model with 1, 8 and 32
// concurrent streaming clients over loopback HTTP (SSE): aggregate tokens/s
// and the p50/p99 time to first token and inter-token latency.
//
//	go test -run XXX -bench ServeStreams -benchtime 1x ./cmd/troupe
func BenchmarkServeStreams(b *testing.B) {
	for _, streams := range []int{1, 8, 32} {
		b.Run(fmt.Sprint("streams=", streams), func(b *testing.B) {
			s := startServe(b, nil)
			const tokens = 64
			var ttft, itl []time.Duration
			var total int
			var mu sync.Mutex
			start := time.Now()
			for b.Loop() {
				var wg sync.WaitGroup
				for c := 0; c < streams; c++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						t, gaps, n, err := streamOnce(s.url, tokens)
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						ttft, itl, total = append(ttft, t), append(itl, gaps...), total+n
						mu.Unlock()
					}()
				}
				wg.Wait()
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(total)/elapsed.Seconds(), "tok/s")
			b.ReportMetric(ms(pct(ttft, 50)), "ttft_p50_ms")
			b.ReportMetric(ms(pct(ttft, 99)), "ttft_p99_ms")
			b.ReportMetric(ms(pct(itl, 50)), "itl_p50_ms")
			b.ReportMetric(ms(pct(itl, 99)), "itl_p99_ms")
		})
	}
}

// streamOnce runs one streaming completion and returns its time to first
// token, the gaps between later tokens and the token count.
func streamOnce(url string, tokens int) (time.Duration, []time.Duration, int, error) {
	body := fmt.Sprintf(`{"model":%q,"prompt":"The kernel","max_tokens":%d,"temperature":0,"stream":true,"ignore_eos":true}`, demo.Name, tokens)
	t0 := time.Now()
	req, _ := http.NewRequestWithContext(context.Background(), "POST", url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, nil, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	var first time.Duration
	var gaps []time.Duration
	last := t0
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: {") {
			continue
		}
		now := time.Now()
		if n == 0 {
			first = now.Sub(t0)
		} else {
			gaps = append(gaps, now.Sub(last))
		}
		last = now
		n++
	}
	return first, gaps, n, sc.Err()
}

func pct(v []time.Duration, p int) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
