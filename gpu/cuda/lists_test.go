package cuda

import (
	"testing"

	"github.com/troupe/troupe/gpu"
)

// TestPlanLists follows the kept lists' bookkeeping over a long run of
// draws, as adjustLogits applies it: two rows always follow with
// penalties, one follows with a bias alone (no entry added), and one
// starts a list of 60 entries every other draw. The entries kept stay
// within twice the live ones and compactSlack, compaction takes place
// and then starts the appends at the following rows' live entries, and a
// row that follows a draw the buffer does not know is refused.
func TestPlanLists(t *testing.T) {
	pen := gpu.Penalties{Presence: 0.5}
	if _, err := planLists(nil, []gpu.SampleRow{{Follows: true}}); err == nil {
		t.Fatal("a row following no draw was planned")
	}
	var l *drawnLists
	compactions := 0
	for k := range 400 {
		rows := []gpu.SampleRow{{Penalties: pen}, {Penalties: pen}, {}, {Penalties: pen}}
		for r := range rows {
			if k > 0 && (r < 3 || k%2 == 1) {
				rows[r].Follows = true
				continue
			}
			n := 60
			if r < 3 {
				n = 5
			}
			for j := range n {
				rows[r].Adjust = append(rows[r].Adjust, gpu.LogitAdjust{ID: int32(j), Bias: 1})
			}
		}
		p, err := planLists(l, rows)
		if err != nil {
			t.Fatalf("draw %d: %v", k, err)
		}
		live, carried := 0, 0
		for r, x := range p.live {
			live += x
			if rows[r].Follows {
				carried += l.live[r]
			}
		}
		if k > 0 && p.live[2] != 5 {
			t.Fatalf("draw %d: the bias-only row's live entries grew to %d", k, p.live[2])
		}
		if p.compact {
			compactions++
			if p.base != carried || p.old <= 2*carried+compactSlack {
				t.Fatalf("draw %d: compaction from %d entries of %d live starts appends at %d", k, p.old, carried, p.base)
			}
		}
		if limit := 2*live + compactSlack + 60 + len(rows); p.bound > limit {
			t.Fatalf("draw %d: %d entries kept for %d live, more than %d", k, p.bound, live, limit)
		}
		if l == nil {
			l = &drawnLists{}
		}
		l.rows, l.bound, l.live = len(rows), p.bound, p.live
	}
	if compactions == 0 {
		t.Fatal("no compaction in 400 draws")
	}
	// Rows that neither adjust nor follow leave nothing to keep.
	if p, err := planLists(l, make([]gpu.SampleRow, 4)); err != nil || p.adjusts || p.bound != 0 {
		t.Fatalf("plain rows: %+v, %v", p, err)
	}
}

// TestPostAhead checks which one-token post-norm products take the kernels
// that ask for their second group before the prologue: OLMo-2-1B's q|k|v
// (6,144 rows of 2,048) and gate|up (16,384), not OLMo-2-7B's (12,288 and
// 22,016 rows of 4,096), on an H200's grid of 4 × 132 blocks.
func TestPostAhead(t *testing.T) {
	for _, c := range []struct {
		ks, rows int
		want     bool
	}{{4, 6144, true}, {4, 16384, true}, {8, 12288, false}, {8, 22016, false}} {
		if got := postAhead(c.ks, c.rows, 528); got != c.want {
			t.Errorf("postAhead(ks %d, %d rows) = %v, want %v", c.ks, c.rows, got, c.want)
		}
	}
}
