package xgmi

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"net"
	"sync"
	"time"
)

// The host stream protocol moves published host buffers between processes
// over one TCP connection per pair of nodes.
//
// Every message is a frame:
//
//	length  uint32 big-endian: bytes of type + body
//	type    byte
//	body    length-1 bytes
//	crc     uint32 big-endian: CRC-32C of type + body
//
// A connection opens with the server's challenge (a random nonce) and the
// client's answer, HMAC-SHA256(key, nonce) with the cluster's shared key;
// the server answers frameOK or closes. Then the client sends fetch frames
// (name, offset, count in floats) and the server answers each, in order,
// with a data frame (little-endian f32) or an error frame (text).
const (
	frameChallenge byte = 1
	frameAuth      byte = 2
	frameOK        byte = 3
	frameFetch     byte = 4
	frameData      byte = 5
	frameError     byte = 6

	nonceSize = 32
	// MaxFrame is the largest frame body a peer accepts, in bytes.
	MaxFrame = 1 << 28
	maxName  = 1024
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrUnreachable marks a fetch that failed because the peer could not be
// reached or dropped the connection, as opposed to a refused request.
var ErrUnreachable = errors.New("xgmi: peer unreachable")

// ErrFrame marks a malformed frame: a bad length, type or checksum.
var ErrFrame = errors.New("xgmi: malformed frame")

// ErrAuth marks a failed handshake.
var ErrAuth = errors.New("xgmi: authentication failed")

// writeFrame writes one frame to w.
func writeFrame(w io.Writer, typ byte, body []byte) error {
	if len(body)+1 > MaxFrame {
		return fmt.Errorf("%w: body of %d bytes over %d", ErrFrame, len(body), MaxFrame)
	}
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[:4], uint32(len(body)+1))
	hdr[4] = typ
	crc := crc32.Update(crc32.Checksum(hdr[4:], castagnoli), castagnoli, body)
	var tail [4]byte
	binary.BigEndian.PutUint32(tail[:], crc)
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := w.Write(body); err != nil {
		return err
	}
	_, err := w.Write(tail[:])
	return err
}

// readFrame reads one frame from r, reusing buf for the body when it is
// large enough. It never allocates more than limit bytes.
func readFrame(r io.Reader, buf []byte, limit int) (typ byte, body []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n < 1 || uint64(n-1) > uint64(limit) {
		return 0, nil, fmt.Errorf("%w: body of %d bytes outside 0..%d", ErrFrame, int64(n)-1, limit)
	}
	typ = hdr[4]
	if typ < frameChallenge || typ > frameError {
		return 0, nil, fmt.Errorf("%w: unknown type %d", ErrFrame, typ)
	}
	size := int(n) - 1
	if cap(buf) >= size {
		body = buf[:size]
	} else {
		body = make([]byte, size)
	}
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, noEOF(err)
	}
	var tail [4]byte
	if _, err := io.ReadFull(r, tail[:]); err != nil {
		return 0, nil, noEOF(err)
	}
	crc := crc32.Update(crc32.Checksum(hdr[4:], castagnoli), castagnoli, body)
	if got := binary.BigEndian.Uint32(tail[:]); got != crc {
		return 0, nil, fmt.Errorf("%w: checksum %08x, want %08x", ErrFrame, got, crc)
	}
	return typ, body, nil
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// fetchReq is the body of a fetch frame.
type fetchReq struct {
	name string
	off  uint64
	n    uint64
}

func (f fetchReq) encode() []byte {
	b := make([]byte, 0, 2+len(f.name)+16)
	b = binary.BigEndian.AppendUint16(b, uint16(len(f.name)))
	b = append(b, f.name...)
	b = binary.BigEndian.AppendUint64(b, f.off)
	return binary.BigEndian.AppendUint64(b, f.n)
}

func decodeFetch(b []byte) (fetchReq, error) {
	if len(b) < 2 {
		return fetchReq{}, fmt.Errorf("%w: fetch of %d bytes", ErrFrame, len(b))
	}
	nl := int(binary.BigEndian.Uint16(b))
	if nl == 0 || nl > maxName || len(b) != 2+nl+16 {
		return fetchReq{}, fmt.Errorf("%w: fetch of %d bytes with a name of %d", ErrFrame, len(b), nl)
	}
	f := fetchReq{name: string(b[2 : 2+nl])}
	f.off = binary.BigEndian.Uint64(b[2+nl:])
	f.n = binary.BigEndian.Uint64(b[2+nl+8:])
	if f.off > math.MaxInt32 || f.n > MaxFrame/4 {
		return fetchReq{}, fmt.Errorf("%w: fetch of %d floats at %d", ErrFrame, f.n, f.off)
	}
	return f, nil
}

func authMAC(key, nonce []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("troupe host stream v1\x00"))
	m.Write(nonce)
	return m.Sum(nil)
}

// StreamConfig configures both ends of the host stream.
type StreamConfig struct {
	// Key is the cluster's shared secret: a peer proves it holds it.
	Key []byte
	// HandshakeTimeout bounds the challenge and answer.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a server connection with no request for this long.
	IdleTimeout time.Duration
	// TLS, when set, encrypts every connection: a server uses it as its
	// tls.Config (its certificate, and ClientCAs to verify clients), a
	// client likewise (RootCAs to verify servers; ServerName defaults to
	// the host it dials). The key handshake then runs inside TLS.
	TLS *tls.Config
}

// DefaultStreamConfig has no key (Validate fails until one is set), a
// five-second handshake and a ten-minute idle timeout.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{HandshakeTimeout: 5 * time.Second, IdleTimeout: 10 * time.Minute}
}

// Validate reports the first problem with c.
func (c StreamConfig) Validate() error {
	switch {
	case len(c.Key) < 16:
		return fmt.Errorf("xgmi: stream key of %d bytes: want at least 16", len(c.Key))
	case c.HandshakeTimeout <= 0 || c.IdleTimeout <= 0:
		return errors.New("xgmi: stream timeouts must be positive")
	}
	return nil
}

// StreamServer serves a Host's published buffers to authenticated peers.
type StreamServer struct {
	host *Host
	cfg  StreamConfig

	connsMu sync.Mutex
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup // one per connection goroutine
}

// NewStreamServer returns a server of h's buffers.
func NewStreamServer(h *Host, cfg StreamConfig) (*StreamServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &StreamServer{host: h, cfg: cfg, conns: map[net.Conn]struct{}{}}, nil
}

// Serve accepts connections on ln until ctx ends or ln fails, then closes
// ln and every connection and waits for their goroutines. It returns nil
// when ctx ended.
func (s *StreamServer) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer s.closeAll()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("xgmi: accept: %w", err)
		}
		s.connsMu.Lock()
		if s.closed {
			s.connsMu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.connsMu.Unlock()
		go s.handle(c)
	}
}

func (s *StreamServer) closeAll() {
	s.connsMu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.connsMu.Unlock()
	s.wg.Wait()
}

func (s *StreamServer) handle(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.connsMu.Lock()
		delete(s.conns, c)
		s.connsMu.Unlock()
		c.Close()
	}()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	rw := c // deadlines go on c; bytes through rw
	if s.cfg.TLS != nil {
		tc := tls.Server(c, s.cfg.TLS)
		_ = c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
		if tc.Handshake() != nil {
			return
		}
		rw = tc
	}
	r := bufio.NewReaderSize(rw, 64<<10)
	w := bufio.NewWriterSize(rw, 64<<10)
	if !s.handshake(c, r, w) {
		return
	}
	var in []byte
	var out []byte
	for {
		_ = c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		typ, body, err := readFrame(r, in, 2+maxName+16)
		if err != nil {
			return
		}
		in = body
		if typ != frameFetch {
			return
		}
		f, err := decodeFetch(body)
		if err != nil {
			_ = writeFrame(w, frameError, []byte(err.Error()))
			_ = w.Flush()
			return
		}
		data, err := s.host.Read(f.name, int(f.off), int(f.n))
		if err != nil {
			err = writeFrame(w, frameError, []byte(err.Error()))
		} else {
			out = appendFloats(out[:0], data)
			err = writeFrame(w, frameData, out)
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			return
		}
	}
}

func (s *StreamServer) handshake(c net.Conn, r *bufio.Reader, w *bufio.Writer) bool {
	_ = c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	nonce := make([]byte, nonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return false
	}
	if writeFrame(w, frameChallenge, nonce) != nil || w.Flush() != nil {
		return false
	}
	typ, body, err := readFrame(r, nil, sha256.Size)
	if err != nil || typ != frameAuth || !hmac.Equal(body, authMAC(s.cfg.Key, nonce)) {
		_ = writeFrame(w, frameError, []byte("authentication failed"))
		_ = w.Flush()
		return false
	}
	if writeFrame(w, frameOK, nil) != nil || w.Flush() != nil {
		return false
	}
	_ = c.SetDeadline(time.Time{})
	return true
}

func appendFloats(b []byte, fs []float32) []byte {
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

// Resolver returns the stream address (host:port) of a node.
type Resolver func(ctx context.Context, node string) (string, error)

// StreamClient fetches buffers from other nodes' stream servers, keeping
// one connection per node. Fetches to one node are serialized; fetches to
// different nodes run concurrently. It is safe for concurrent use.
type StreamClient struct {
	cfg     StreamConfig
	resolve Resolver
	dialer  net.Dialer

	mu    sync.Mutex
	peers map[string]*peer
}

type peer struct {
	mu   sync.Mutex // one fetch at a time on conn
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	buf  []byte
}

// NewStreamClient returns a client that finds peers through resolve.
func NewStreamClient(cfg StreamConfig, resolve Resolver) (*StreamClient, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if resolve == nil {
		return nil, errors.New("xgmi: stream client needs a resolver")
	}
	return &StreamClient{cfg: cfg, resolve: resolve, peers: map[string]*peer{}}, nil
}

// Fetch reads n floats at offset off of the buffer published as name on
// node. Failures to reach node wrap ErrUnreachable; a refusal by the peer
// (unknown buffer, range) does not.
func (c *StreamClient) Fetch(ctx context.Context, node, name string, off, n int) ([]float32, error) {
	if name == "" || len(name) > maxName || off < 0 || n < 0 || n > MaxFrame/4 {
		return nil, fmt.Errorf("xgmi: fetch %q [%d, +%d) from %s: bad request", name, off, n, node)
	}
	c.mu.Lock()
	p, ok := c.peers[node]
	if !ok {
		p = &peer{}
		c.peers[node] = p
	}
	c.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	req := fetchReq{name: name, off: uint64(off), n: uint64(n)}
	var out []float32
	var err error
	// A kept connection may be to a process that has since restarted:
	// one failure on it earns one fresh dial.
	for attempt := 0; attempt < 2; attempt++ {
		reused := p.conn != nil
		if !reused {
			if err := c.connect(ctx, node, p); err != nil {
				return nil, err
			}
		}
		out, err = p.fetch(ctx, req)
		if err == nil || !errors.Is(err, ErrUnreachable) {
			break
		}
		p.conn.Close()
		p.conn = nil
		if !reused || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("xgmi: fetch %s from %s: %w", name, node, err)
	}
	return out, nil
}

func (c *StreamClient) connect(ctx context.Context, node string, p *peer) error {
	addr, err := c.resolve(ctx, node)
	if err != nil {
		return fmt.Errorf("xgmi: resolve %s: %w: %w", node, ErrUnreachable, err)
	}
	conn, err := c.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("xgmi: dial %s at %s: %w: %w", node, addr, ErrUnreachable, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	dl := time.Now().Add(c.cfg.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = conn.SetDeadline(dl)
	fail := func(err error) error {
		conn.Close()
		return fmt.Errorf("xgmi: handshake with %s at %s: %w", node, addr, err)
	}
	if c.cfg.TLS != nil {
		cfg := c.cfg.TLS.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail(fmt.Errorf("%w: tls: %w", ErrAuth, err))
		}
		conn = tc
	}
	r, w := bufio.NewReaderSize(conn, 64<<10), bufio.NewWriter(conn)
	typ, nonce, err := readFrame(r, nil, nonceSize)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrUnreachable, err))
	}
	if typ != frameChallenge || len(nonce) != nonceSize {
		return fail(fmt.Errorf("%w: frame %d, want a challenge", ErrFrame, typ))
	}
	if err := writeFrame(w, frameAuth, authMAC(c.cfg.Key, nonce)); err != nil {
		return fail(fmt.Errorf("%w: %w", ErrUnreachable, err))
	}
	if err := w.Flush(); err != nil {
		return fail(fmt.Errorf("%w: %w", ErrUnreachable, err))
	}
	typ, _, err = readFrame(r, nil, 1024)
	if err != nil || typ != frameOK {
		return fail(ErrAuth)
	}
	_ = conn.SetDeadline(time.Time{})
	p.conn, p.r, p.w = conn, r, w
	return nil
}

func (p *peer) fetch(ctx context.Context, f fetchReq) ([]float32, error) {
	if d, ok := ctx.Deadline(); ok {
		_ = p.conn.SetDeadline(d)
	} else {
		_ = p.conn.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = p.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := writeFrame(p.w, frameFetch, f.encode()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	if err := p.w.Flush(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	typ, body, err := readFrame(p.r, p.buf, int(4*f.n)+1+1024)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnreachable, ctx.Err())
		}
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	p.buf = body
	switch typ {
	case frameError:
		return nil, fmt.Errorf("peer refused: %s", body)
	case frameData:
	default:
		return nil, fmt.Errorf("%w: %w: frame type %d, want data", ErrUnreachable, ErrFrame, typ)
	}
	if uint64(len(body)) != 4*f.n {
		return nil, fmt.Errorf("%w: %w: %d bytes, want %d", ErrUnreachable, ErrFrame, len(body), 4*f.n)
	}
	out := make([]float32, f.n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*i:]))
	}
	return out, nil
}

// Forget closes the connection to node, if any; the next fetch redials.
func (c *StreamClient) Forget(node string) {
	c.mu.Lock()
	p, ok := c.peers[node]
	delete(c.peers, node)
	c.mu.Unlock()
	if ok {
		p.mu.Lock()
		if p.conn != nil {
			p.conn.Close()
			p.conn = nil
		}
		p.mu.Unlock()
	}
}

// Close closes every connection.
func (c *StreamClient) Close() {
	c.mu.Lock()
	peers := c.peers
	c.peers = map[string]*peer{}
	c.mu.Unlock()
	for _, p := range peers {
		p.mu.Lock()
		if p.conn != nil {
			p.conn.Close()
			p.conn = nil
		}
		p.mu.Unlock()
	}
}
