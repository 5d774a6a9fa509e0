package host

import (
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/troupe/troupe/gpu"
)

var _ gpu.MemoryReporter = Memory{}

// files serves a fixed set of files, as os.ReadFile would.
func files(m map[string]string) func(string) ([]byte, error) {
	return func(name string) ([]byte, error) {
		if s, ok := m[name]; ok {
			return []byte(s), nil
		}
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
}

const meminfo = "MemTotal:       24568204 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\nBuffers:            1234 kB\n"

func TestFreeMemory(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		name        string
		files       map[string]string
		free, total int64
		err         bool
	}{
		{"no cgroups", map[string]string{"/proc/meminfo": meminfo}, 20000000 << 10, 24568204 << 10, false},
		{"v2 without a limit", map[string]string{"/proc/meminfo": meminfo, "/proc/self/cgroup": "0::/user.slice/app\n",
			"/sys/fs/cgroup/user.slice/app/memory.max": "max\n", "/sys/fs/cgroup/user.slice/app/memory.current": "123\n"},
			20000000 << 10, 24568204 << 10, false},
		{"v2 limit on a parent", map[string]string{"/proc/meminfo": meminfo, "/proc/self/cgroup": "0::/kube/pod/c\n",
			"/sys/fs/cgroup/kube/pod/memory.max": "8589934592\n", "/sys/fs/cgroup/kube/pod/memory.current": "2147483648\n"},
			6 * gib, 8 * gib, false},
		{"v2 page cache left out of the use", map[string]string{"/proc/meminfo": meminfo, "/proc/self/cgroup": "0::/ci\n",
			"/sys/fs/cgroup/ci/memory.max": "8589934592\n", "/sys/fs/cgroup/ci/memory.current": "7516192768\n",
			"/sys/fs/cgroup/ci/memory.stat": "anon 1073741824\nfile 6442450944\nactive_file 1073741824\ninactive_file 5368709120\n"},
			6 * gib, 8 * gib, false},
		{"v2 with a stat beyond the use", map[string]string{"/proc/meminfo": meminfo, "/proc/self/cgroup": "0::/ci\n",
			"/sys/fs/cgroup/ci/memory.max": "8589934592\n", "/sys/fs/cgroup/ci/memory.current": "1073741824\n",
			"/sys/fs/cgroup/ci/memory.stat": "inactive_file 9999999999\n"},
			8 * gib, 8 * gib, false},
		{"v2 inside a container (the mount's root)", map[string]string{"/proc/meminfo": meminfo, "/proc/self/cgroup": "0::/../../kube/c\n",
			"/sys/fs/cgroup/memory.max": "4294967296", "/sys/fs/cgroup/memory.current": "5368709120"},
			0, 4 * gib, false},
		{"v1 memory controller", map[string]string{"/proc/meminfo": meminfo,
			"/proc/self/cgroup":                           "5:devices:/\n4:cpu,memory:/docker/abc\n1:name=systemd:/\n",
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n", "/sys/fs/cgroup/memory/memory.usage_in_bytes": "1\n",
			"/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "2147483648\n", "/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": "1610612736\n",
			"/sys/fs/cgroup/memory/docker/abc/memory.stat": "cache 600000000\ninactive_file 1\ntotal_inactive_file 536870912\n"},
			1 * gib, 2 * gib, false},
		{"no meminfo", map[string]string{}, 0, 0, true},
		{"meminfo without MemAvailable", map[string]string{"/proc/meminfo": "MemTotal: 100 kB\n"}, 0, 0, true},
		{"meminfo in pages", map[string]string{"/proc/meminfo": "MemTotal: 100 pages\nMemAvailable: 5 kB\n"}, 0, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			free, total, err := freeMemory(files(c.files))
			if (err != nil) != c.err {
				t.Fatalf("error %v, want one: %v", err, c.err)
			}
			if free != c.free || total != c.total {
				t.Errorf("free %d, total %d; want %d, %d", free, total, c.free, c.total)
			}
		})
	}
}

// TestFreeMemoryHere reads this machine's figures: Linux has them, other
// systems say why not.
func TestFreeMemoryHere(t *testing.T) {
	free, total, err := Memory{}.FreeMemory()
	if err != nil {
		if _, statErr := files(nil)("/proc/meminfo"); !errors.Is(statErr, fs.ErrNotExist) {
			t.Fatal(err)
		}
		t.Logf("no figures here: %v", err)
		return
	}
	if total <= 0 || free < 0 || free > total {
		t.Errorf("free %d of %d bytes", free, total)
	}
}

func FuzzMemoryFiles(f *testing.F) {
	f.Add([]byte(meminfo), []byte("0::/a/b\n4:memory:/c\n"), []byte("max"), []byte("12"), []byte("inactive_file 5\n"))
	f.Add([]byte("MemAvailable: x kB"), []byte("0::"), []byte("-1"), []byte(""), []byte("total_inactive_file -3"))
	f.Fuzz(func(t *testing.T, mi, cg, limit, usage, stat []byte) {
		read := func(name string) ([]byte, error) {
			switch name {
			case "/proc/meminfo":
				return mi, nil
			case "/proc/self/cgroup":
				return cg, nil
			}
			switch {
			case strings.HasSuffix(name, "memory.max") || strings.HasSuffix(name, "limit_in_bytes"):
				return limit, nil
			case strings.HasSuffix(name, "memory.stat"):
				return stat, nil
			}
			return usage, nil
		}
		free, total, err := freeMemory(read)
		if err == nil && (free < 0 || total < 0) {
			t.Errorf("free %d, total %d", free, total)
		}
	})
}
