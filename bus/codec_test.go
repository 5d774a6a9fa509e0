package bus

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

type testPing struct {
	Seq   uint64
	Text  string
	Tags  []string
	Attrs map[string]string
	Ref   *TensorRef
}

func (testPing) Schema() Schema { return Schema{ID: "test.ping", Version: 2} }

type testPingV1 struct {
	Seq  uint64
	Text string
}

func (testPingV1) Schema() Schema { return Schema{ID: "test.ping", Version: 1} }

type testOther struct{ Seq uint64 }

func (testOther) Schema() Schema { return Schema{ID: "test.other", Version: 2} }

type testPingExtra struct {
	Seq   uint64
	Extra string
}

func (testPingExtra) Schema() Schema { return Schema{ID: "test.ping", Version: 2} }

type testBlob struct{ Data []byte }

func (testBlob) Schema() Schema { return Schema{ID: "test.blob", Version: 1} }

func samplePing() testPing {
	return testPing{
		Seq: 7, Text: "hello", Tags: []string{"a", "b"}, Attrs: map[string]string{"k": "v"},
		Ref: &TensorRef{Location: LocationDevice, Node: "n1", Device: 1, Buffer: "buf", Bytes: 16, DType: F32, Shape: []int64{2, 2}},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	in := samplePing()
	data, err := Encode(in)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	var out testPing
	if err := Decode(data, &out); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip: got %+v, want %+v", out, in)
	}
	s, err := PeekSchema(data)
	if err != nil || s != in.Schema() {
		t.Errorf("PeekSchema = %v, %v, want %v", s, err, in.Schema())
	}
}

// rawEnvelope encodes an envelope with any body, bypassing Encode's checks.
func rawEnvelope(t testing.TB, id string, version uint16, body any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := enc.EncodeArrayLen(3); err != nil {
		t.Fatal(err)
	}
	if err := enc.EncodeString(id); err != nil {
		t.Fatal(err)
	}
	if err := enc.EncodeUint16(version); err != nil {
		t.Fatal(err)
	}
	if err := enc.Encode(body); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecodeRejects(t *testing.T) {
	good, err := Encode(samplePing())
	if err != nil {
		t.Fatal(err)
	}
	v1, err := Encode(testPingV1{Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	other, err := Encode(testOther{Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	extra, err := Encode(testPingExtra{Seq: 1, Extra: "x"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		data []byte
		is   error  // errors.Is target, or nil
		want string // substring of the message
	}{
		{"empty", nil, ErrMalformed, "truncated"},
		{"unknown schema", other, ErrUnknownSchema, `"test.other"`},
		{"wrong version", v1, ErrWrongVersion, "version 1"},
		{"unknown field", extra, nil, "Extra"},
		{"trailing bytes", append(append([]byte{}, good...), 0xc0), ErrMalformed, "trailing"},
		{"truncated", good[:len(good)-1], ErrMalformed, ""},
		{"too large", make([]byte, MaxMessageSize+1), ErrTooLarge, "limit"},
		{"not an envelope", []byte{0x93, 0x01, 0x02, 0x03}, ErrMalformed, "schema id"},
		{"two elements", []byte{0x92, 0xa1, 'x', 0x01}, ErrMalformed, "envelope"},
		{"body not a map", rawEnvelope(t, "test.ping", 2, []int{1}), ErrMalformed, "not a map"},
		{"wrong field type", rawEnvelope(t, "test.ping", 2, map[string]any{"Seq": "seven"}), nil, "decoding uint64"},
		{"huge array", []byte{0x93, 0xa9, 't', 'e', 's', 't', '.', 'p', 'i', 'n', 'g', 0x02, 0x81, 0xa4, 'T', 'a', 'g', 's', 0xdd, 0xff, 0xff, 0xff, 0xff}, ErrMalformed, "impossible"},
		{"huge map", []byte{0xdf, 0x7f, 0xff, 0xff, 0xff}, ErrMalformed, "impossible"},
		{"huge string", []byte{0x93, 0xdb, 0xff, 0xff, 0xff, 0xff}, ErrMalformed, "truncated"},
		{"never-used byte", []byte{0xc1}, ErrMalformed, "invalid type byte"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out testPing
			err := Decode(tt.data, &out)
			if err == nil {
				t.Fatal("Decode succeeded, want an error")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("Decode = %v, want errors.Is %v", err, tt.is)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Decode = %v, want it to mention %q", err, tt.want)
			}
			if CodeOf(err) == CodeInternal && tt.is != nil {
				t.Errorf("CodeOf(%v) = internal, want bad_request", err)
			}
		})
	}
}

func TestEncodeTooLarge(t *testing.T) {
	_, err := Encode(testBlob{Data: make([]byte, MaxMessageSize)})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("Encode = %v, want ErrTooLarge", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(mustEncode(f, samplePing()))
	f.Add(mustEncode(f, testPingV1{Seq: 3, Text: "x"}))
	f.Add(mustEncode(f, testOther{}))
	f.Add(mustEncode(f, testPingExtra{Extra: "y"}))
	f.Add([]byte{})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x93, 0xa9, 't', 'e', 's', 't', '.', 'p', 'i', 'n', 'g', 0x02, 0x81, 0xa4, 'T', 'a', 'g', 's', 0xdd, 0x00, 0x10, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		var out testPing
		if err := Decode(data, &out); err != nil {
			return
		}
		// Whatever decodes must encode and decode to the same value.
		again, err := Encode(out)
		if err != nil {
			t.Fatalf("re-encode of a decoded message: %v", err)
		}
		var out2 testPing
		if err := Decode(again, &out2); err != nil {
			t.Fatalf("decode of a re-encoded message: %v", err)
		}
		if !reflect.DeepEqual(normalize(out), normalize(out2)) {
			t.Fatalf("re-encode changed the message: %+v vs %+v", out, out2)
		}
	})
}

// normalize maps empty collections to nil: msgpack does not tell them apart.
func normalize(p testPing) testPing {
	if len(p.Tags) == 0 {
		p.Tags = nil
	}
	if len(p.Attrs) == 0 {
		p.Attrs = nil
	}
	if p.Ref != nil && len(p.Ref.Shape) == 0 {
		r := *p.Ref
		r.Shape = nil
		p.Ref = &r
	}
	return p
}

func mustEncode[T Message](tb testing.TB, m T) []byte {
	tb.Helper()
	data, err := Encode(m)
	if err != nil {
		tb.Fatalf("Encode: %v", err)
	}
	return data
}
