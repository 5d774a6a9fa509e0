package host

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// FreeMemory implements gpu.MemoryReporter on Linux: MemAvailable and
// MemTotal from /proc/meminfo, each bounded by the memory limits of the
// process's cgroup (v2, or v1's memory controller) and its parents, less
// what they use, where any is set (a container's limit). A group's use
// leaves out its inactive file pages, which the kernel reclaims before
// the limit is reached (the working set, as container runtimes count it).
func (Memory) FreeMemory() (free, total int64, err error) {
	return freeMemory(os.ReadFile)
}

// freeMemory is FreeMemory reading files through read.
func freeMemory(read func(string) ([]byte, error)) (free, total int64, err error) {
	raw, err := read("/proc/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("host memory: %w", err)
	}
	if free, total, err = parseMeminfo(raw); err != nil {
		return 0, 0, fmt.Errorf("host memory: /proc/meminfo: %w", err)
	}
	raw, err = read("/proc/self/cgroup")
	if err != nil {
		return free, total, nil // no cgroups: the machine's figures
	}
	for _, g := range cgroups(raw) {
		// Inside a container the mount's root is the container's own
		// group, so the walk up from the host's path reaches it.
		for dir := g.path; ; dir = path.Dir(dir) {
			lim, limErr := read(path.Join(g.root, dir, g.limit))
			cur, curErr := read(path.Join(g.root, dir, g.usage))
			if limErr == nil && curErr == nil {
				if limit, used, ok := cgroupLimit(lim, cur); ok {
					if stat, err := read(path.Join(g.root, dir, "memory.stat")); err == nil {
						used -= min(used, statField(stat, g.inactive))
					}
					total = min(total, limit)
					free = min(free, max(0, limit-used))
				}
			}
			if dir == "/" {
				break
			}
		}
	}
	return free, total, nil
}

// parseMeminfo reads MemAvailable and MemTotal (kB) from /proc/meminfo,
// in bytes.
func parseMeminfo(raw []byte) (avail, total int64, err error) {
	avail, total = -1, -1
	for _, line := range bytes.Split(raw, []byte("\n")) {
		name, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *int64
		switch string(name) {
		case "MemAvailable":
			dst = &avail
		case "MemTotal":
			dst = &total
		default:
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, 0, fmt.Errorf("%s: %q, want a count of kB", name, bytes.TrimSpace(rest))
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil || kb < 0 || kb > 1<<53 {
			return 0, 0, fmt.Errorf("%s: %q, want a count of kB", name, f[0])
		}
		*dst = kb << 10
	}
	if avail < 0 || total < 0 {
		return 0, 0, fmt.Errorf("no MemAvailable and MemTotal")
	}
	return avail, total, nil
}

// cgroup is where a cgroup's memory limit and usage are read: files limit
// and usage in root/path and its parents, and memory.stat's field
// inactive, the inactive file pages.
type cgroup struct{ root, path, limit, usage, inactive string }

// cgroups reads the process's memory cgroups from /proc/self/cgroup: the
// v2 group (a line "0::/path") and v1's memory controller ("N:...memory...:/path").
func cgroups(raw []byte) []cgroup {
	var gs []cgroup
	for _, line := range bytes.Split(raw, []byte("\n")) {
		f := bytes.SplitN(line, []byte(":"), 3)
		if len(f) != 3 || len(f[2]) == 0 || f[2][0] != '/' {
			continue
		}
		p := path.Clean(string(f[2]))
		switch {
		case string(f[0]) == "0" && len(f[1]) == 0:
			gs = append(gs, cgroup{"/sys/fs/cgroup", p, "memory.max", "memory.current", "inactive_file"})
		case slices.Contains(strings.Split(string(f[1]), ","), "memory"):
			gs = append(gs, cgroup{"/sys/fs/cgroup/memory", p, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"})
		}
	}
	return gs
}

// cgroupLimit reads a cgroup's limit and usage; false where it sets no
// limit (v2's "max"; v1's is a count beyond any memory) or either is not a
// byte count.
func cgroupLimit(limitRaw, usageRaw []byte) (limit, used int64, ok bool) {
	l, err := strconv.ParseInt(string(bytes.TrimSpace(limitRaw)), 10, 64)
	if err != nil || l < 0 || l >= 1<<62 {
		return 0, 0, false
	}
	u, err := strconv.ParseInt(string(bytes.TrimSpace(usageRaw)), 10, 64)
	if err != nil || u < 0 {
		return 0, 0, false
	}
	return l, u, true
}

// statField is the count a memory.stat file gives for name (lines "name
// count"), 0 where it has none or not a count.
func statField(raw []byte, name string) int64 {
	for _, line := range bytes.Split(raw, []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) == 2 && string(f[0]) == name {
			if v, err := strconv.ParseInt(string(f[1]), 10, 64); err == nil && v > 0 {
				return v
			}
			return 0
		}
	}
	return 0
}
