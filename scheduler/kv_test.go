package scheduler

import (
	"errors"
	"testing"
)

func seqOf(n int, base int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = base + int32(i)
	}
	return out
}

func TestKVPrefixReuse(t *testing.T) {
	k, err := NewKV(8, 4)
	if err != nil {
		t.Fatal(err)
	}
	prompt := seqOf(10, 100)
	if got, err := k.Start("a", "t1", prompt); err != nil || got != 0 {
		t.Fatalf("start a: %d, %v", got, err)
	}
	if len(k.Table("a")) != 3 {
		t.Fatalf("table %v, want 3 blocks", k.Table("a"))
	}
	k.Commit("a", prompt)
	k.Free("a")
	if s := k.Stats(); s.Cached != 2 || s.Free != 6 || s.Used != 0 {
		t.Fatalf("after free: %+v", s)
	}
	// The same prompt reuses both full blocks.
	if got, _ := k.Start("b", "t1", prompt); got != 8 {
		t.Errorf("reused %d tokens, want 8", got)
	}
	// Another tenant reuses nothing.
	if got, _ := k.Start("c", "t2", prompt); got != 0 {
		t.Errorf("other tenant reused %d tokens", got)
	}
	// A prompt that is exactly two blocks leaves its last block to compute.
	if got, _ := k.Start("d", "t1", prompt[:8]); got != 4 {
		t.Errorf("reused %d tokens of an 8-token prompt, want 4", got)
	}
	if s := k.Stats(); s.Hits != 3 {
		t.Errorf("hits %d, want 3", s.Hits)
	}
}

func TestKVEvictionAndExhaustion(t *testing.T) {
	k, _ := NewKV(4, 2)
	p := seqOf(4, 1)
	k.Start("a", "", p)
	k.Commit("a", p)
	k.Free("a") // two cached blocks, two free
	if _, err := k.Start("b", "", seqOf(8, 50)); err != nil {
		t.Fatalf("start b evicting cached blocks: %v", err)
	}
	if s := k.Stats(); s.Cached != 0 || s.Used != 4 {
		t.Errorf("after eviction: %+v", s)
	}
	if _, err := k.Start("c", "", seqOf(3, 9)); !errors.Is(err, ErrNoBlocks) {
		t.Errorf("start on a full pool: %v", err)
	}
	if err := k.Grow("b", 9); !errors.Is(err, ErrNoBlocks) {
		t.Errorf("grow on a full pool: %v", err)
	}
	k.Free("b")
	if err := k.Grow("b", 1); err == nil {
		t.Error("grow of a freed sequence: no error")
	}
	if s := k.Stats(); s.Free != 4 {
		t.Errorf("after free: %+v", s)
	}
}
