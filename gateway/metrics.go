package gateway

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// histogram is a fixed-bucket Prometheus histogram safe for concurrent use without locks.
type histogram struct {
	bounds  []float64
	counts  []atomic.Uint64 // one per bound, plus +Inf
	sumBits atomic.Uint64
	count   atomic.Uint64
}

func newHistogram(bounds ...float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i, _ := slices.BinarySearch(h.bounds, v)
	h.counts[i].Add(1)
	for {
		old := h.sumBits.Load()
		if h.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			break
		}
	}
	h.count.Add(1)
}

func (h *histogram) write(w io.Writer, name, help string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i].Load()
		fmt.Fprintf(w, "%s_bucket{le=\"%s\"} %d\n", name, formatFloat(b), cum)
	}
	cum += h.counts[len(h.bounds)].Load()
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n", name, cum)
	fmt.Fprintf(w, "%s_sum %s\n%s_count %d\n", name, formatFloat(math.Float64frombits(h.sumBits.Load())), name, cum)
}

// counterVec is a counter with labels; label values are joined by \xff as the key.
type counterVec struct {
	labels []string
	mu     sync.Mutex
	vals   map[string]*atomic.Uint64
}

func newCounterVec(labels ...string) *counterVec {
	return &counterVec{labels: labels, vals: make(map[string]*atomic.Uint64)}
}

func (c *counterVec) inc(values ...string) {
	key := strings.Join(values, "\xff")
	c.mu.Lock()
	v, ok := c.vals[key]
	if !ok {
		v = new(atomic.Uint64)
		c.vals[key] = v
	}
	c.mu.Unlock()
	v.Add(1)
}

func (c *counterVec) write(w io.Writer, name, help string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
	c.mu.Lock()
	keys := make([]string, 0, len(c.vals))
	for k := range c.vals {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	counts := make([]uint64, len(keys))
	for i, k := range keys {
		counts[i] = c.vals[k].Load()
	}
	c.mu.Unlock()
	for i, k := range keys {
		fmt.Fprintf(w, "%s{%s} %d\n", name, labelPairs(c.labels, strings.Split(k, "\xff")), counts[i])
	}
}

func labelPairs(names, values []string) string {
	var sb strings.Builder
	for i, n := range names {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(n)
		sb.WriteString(`="`)
		if i < len(values) {
			sb.WriteString(escapeLabel(values[i]))
		}
		sb.WriteByte('"')
	}
	return sb.String()
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// labelName reports whether s is a Prometheus label name (not reserved).
func labelName(s string) bool {
	if s == "" || strings.HasPrefix(s, "__") {
		return false
	}
	for i, c := range s {
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	case math.IsNaN(f):
		return "NaN"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func writeGauge(w io.Writer, name, help string, v float64) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s %s\n", name, help, name, name, formatFloat(v))
}

func writeCounter(w io.Writer, name, help string, v uint64) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
}

// metrics holds everything the gateway exports.
type metrics struct {
	requests         *counterVec // route, code
	ttft             *histogram
	itl              *histogram
	queueWait        *histogram
	promptTokens     atomic.Uint64
	completionTokens atomic.Uint64
	wsConns          atomic.Int64
	wsResumes        atomic.Uint64
}

func newMetrics() *metrics {
	return &metrics{
		requests:  newCounterVec("route", "code"),
		ttft:      newHistogram(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
		itl:       newHistogram(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
		queueWait: newHistogram(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
	}
}

// exposition writes the Prometheus text format (version 0.0.4).
func (s *Server) writeMetrics(out io.Writer) error {
	w := bufio.NewWriter(out)
	m := s.met
	if b := s.cfg.Build; len(b) > 0 {
		names := slices.Sorted(maps.Keys(b))
		values := make([]string, len(names))
		for i, n := range names {
			values[i] = b[n]
		}
		fmt.Fprintf(w, "# HELP troupe_build_info The build this gateway runs, named by its labels.\n# TYPE troupe_build_info gauge\ntroupe_build_info{%s} 1\n", labelPairs(names, values))
	}
	m.requests.write(w, "troupe_gateway_requests_total", "Requests answered, by route and HTTP status (websocket generations use the status an HTTP request would have had).")
	writeGauge(w, "troupe_gateway_in_flight", "Generations running through this gateway.", float64(s.lim.inUse()))
	writeGauge(w, "troupe_gateway_in_flight_limit", "Generations this gateway admits at once.", float64(s.cfg.MaxInFlight))
	if s.cfg.MaxInFlightPerKey > 0 {
		writeGauge(w, "troupe_gateway_in_flight_per_key_limit", "Generations one API key may run at once through this gateway.", float64(s.cfg.MaxInFlightPerKey))
		writeCounter(w, "troupe_gateway_key_limited_total", "Requests refused (429 key_limit) because their API key was at its in-flight bound.", s.lim.keyLimited())
	}
	m.ttft.write(w, "troupe_gateway_time_to_first_token_seconds", "Time from receiving a request to its first token.")
	m.itl.write(w, "troupe_gateway_inter_token_latency_seconds", "Time between consecutive tokens of a generation.")
	m.queueWait.write(w, "troupe_gateway_queue_wait_seconds", "Time generations waited in the backend queue before starting.")
	writeCounter(w, "troupe_gateway_prompt_tokens_total", "Prompt tokens of finished generations.", m.promptTokens.Load())
	writeCounter(w, "troupe_gateway_completion_tokens_total", "Tokens generated; its rate is the token throughput in tokens per second.", m.completionTokens.Load())
	writeGauge(w, "troupe_gateway_websocket_connections", "Open websocket connections.", float64(m.wsConns.Load()))
	writeGauge(w, "troupe_gateway_websocket_streams", "Websocket requests kept for resume, running or finished.", float64(s.retainedStreams()))
	writeCounter(w, "troupe_gateway_websocket_resumes_total", "Websocket requests resumed after a reconnect.", m.wsResumes.Load())
	ready, _ := s.backend.Ready()
	writeGauge(w, "troupe_backend_ready", "1 when the backend accepts work.", boolFloat(ready))
	if src, ok := s.backend.(StatsSource); ok {
		st := src.Stats()
		writeGauge(w, "troupe_backend_queue_depth", "Requests waiting in the backend queue.", float64(st.QueueDepth))
		writeGauge(w, "troupe_backend_running", "Sequences in the backend's running set.", float64(st.Running))
		writeGauge(w, "troupe_backend_kv_usage_ratio", "Fraction of KV cache blocks in use.", st.KVUsage)
		name := "troupe_backend_mailbox_depth"
		fmt.Fprintf(w, "# HELP %s Messages queued in an actor's mailbox.\n# TYPE %s gauge\n", name, name)
		actors := make([]string, 0, len(st.MailboxDepths))
		for a := range st.MailboxDepths {
			actors = append(actors, a)
		}
		slices.Sort(actors)
		for _, a := range actors {
			fmt.Fprintf(w, "%s{actor=\"%s\"} %d\n", name, escapeLabel(a), st.MailboxDepths[a])
		}
	}
	return w.Flush()
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
