package bus

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// Storage selects where JetStream keeps the streams troupe creates.
type Storage int

const (
	// StorageMemory keeps streams in memory: fast, lost when the node stops.
	StorageMemory Storage = iota
	// StorageFile keeps streams under JetStream.StoreDir.
	StorageFile
)

// String returns "memory" or "file".
func (s Storage) String() string {
	switch s {
	case StorageMemory:
		return "memory"
	case StorageFile:
		return "file"
	}
	return "storage(" + strconv.Itoa(int(s)) + ")"
}

// Config describes one embedded server. The zero value is not valid; start
// from DefaultConfig.
type Config struct {
	// Name is the server name; it must be unique within a cluster and is
	// required when routes are configured (JetStream clustering needs it).
	Name string

	// Listen is the client listener as host:port. Empty means no network
	// listener at all: only in-process connections reach the server. Port 0
	// picks a free port.
	Listen string
	// ClientAuth guards client connections, in-process ones included.
	ClientAuth Auth
	// ClientTLS secures the client listener. In-process connections never
	// use TLS.
	ClientTLS TLSFiles

	// Cluster configures routes to other nodes. Empty Cluster.Listen means
	// the node runs alone. A clustered node needs Listen too: the server
	// starts routing only once its client listener is up.
	Cluster Cluster

	// JetStream configures persistence for KV buckets and streams.
	JetStream JetStream

	// MaxPayload is the largest message the server accepts, in bytes.
	MaxPayload int32

	// Logger receives the server's log lines; nil silences the server.
	Logger server.Logger
}

// Auth is a credential: a user and password, or a token, or neither.
type Auth struct {
	User     string
	Password string
	Token    string
}

func (a Auth) empty() bool { return a == Auth{} }

func (a Auth) validate() error {
	if a.Token != "" && (a.User != "" || a.Password != "") {
		return errors.New("use a token or a user and password, not both")
	}
	if (a.User == "") != (a.Password == "") {
		return errors.New("user and password must be given together")
	}
	return nil
}

// TLSFiles names PEM files for a listener. Cert and Key go together; CA with
// Verify asks peers for certificates signed by it.
type TLSFiles struct {
	Cert   string
	Key    string
	CA     string
	Verify bool
}

func (t TLSFiles) enabled() bool { return t.Cert != "" || t.Key != "" }

func (t TLSFiles) validate() error {
	if (t.Cert == "") != (t.Key == "") {
		return errors.New("tls cert and key must be given together")
	}
	if (t.CA != "" || t.Verify) && !t.enabled() {
		return errors.New("tls ca or verify given without cert and key")
	}
	if t.Verify && t.CA == "" {
		return errors.New("tls verify needs a ca")
	}
	return nil
}

// Cluster configures the route port that joins nodes into one NATS cluster.
// Three nodes, each listing the other two (or one shared seed) in Routes and
// sharing Name, form a cluster in which JetStream replicates with
// JetStream.Replicas up to 3.
type Cluster struct {
	// Name is shared by every node of the cluster.
	Name string
	// Listen is the route listener as host:port; empty disables clustering.
	// Port 0 picks a free port.
	Listen string
	// Advertise is the host:port other nodes use to reach this one, when
	// Listen is not reachable as is (NAT, 0.0.0.0).
	Advertise string
	// Routes are seed routes as host:port or nats-route://host:port.
	Routes []string
	// Auth guards the route port with a user and password; outgoing routes
	// present the same credentials. Tokens are not supported on routes.
	Auth Auth
	// TLS secures routes.
	TLS TLSFiles
}

// JetStream configures the node's JetStream.
type JetStream struct {
	Enabled bool
	// StoreDir holds file streams and, in a cluster, the Raft logs. Empty on
	// a single node means a private temporary directory removed at Shutdown;
	// a clustered node needs an explicit directory.
	StoreDir string
	// MaxMemory and MaxStore limit JetStream's use in bytes; 0 lets the
	// server choose.
	MaxMemory int64
	MaxStore  int64
	// Storage and Replicas are the defaults packages use when they create
	// buckets and streams on this node.
	Storage  Storage
	Replicas int
}

// DefaultMaxPayload is the default max_payload: 1 MiB.
const DefaultMaxPayload = 1 << 20

// DefaultConfig is a single node with no network listener, JetStream on in
// memory, and the default max payload.
func DefaultConfig() Config {
	return Config{
		Name:       "troupe",
		MaxPayload: DefaultMaxPayload,
		JetStream: JetStream{
			Enabled:  true,
			Storage:  StorageMemory,
			Replicas: 1,
		},
	}
}

// LoopbackConfig is a node named name for the processes of one host: a
// client listener on 127.0.0.1 (any port) that asks for a fresh random
// token, and no JetStream.
func LoopbackConfig(name string) (Config, error) {
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return Config{}, fmt.Errorf("bus: token: %w", err)
	}
	c := DefaultConfig()
	c.Name = name
	c.Listen = "127.0.0.1:0"
	c.ClientAuth = Auth{Token: hex.EncodeToString(token)}
	c.JetStream.Enabled = false
	return c, nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Validate reports the first problem with c.
func (c Config) Validate() error {
	if !nameRE.MatchString(c.Name) {
		return fmt.Errorf("bus config: server name %q: want letters, digits, '-' or '_'", c.Name)
	}
	if c.Listen != "" {
		if _, _, err := splitHostPort(c.Listen); err != nil {
			return fmt.Errorf("bus config: listen: %w", err)
		}
	}
	if err := c.ClientAuth.validate(); err != nil {
		return fmt.Errorf("bus config: client auth: %w", err)
	}
	if err := c.ClientTLS.validate(); err != nil {
		return fmt.Errorf("bus config: client: %w", err)
	}
	if c.ClientTLS.enabled() && c.Listen == "" {
		return errors.New("bus config: client tls given without a client listener")
	}
	if c.MaxPayload <= 0 {
		return fmt.Errorf("bus config: max payload %d: want > 0", c.MaxPayload)
	}
	if err := c.Cluster.validate(); err != nil {
		return fmt.Errorf("bus config: cluster: %w", err)
	}
	if c.Cluster.Listen != "" && c.Listen == "" {
		// nats-server starts routing only once the client listener is up.
		return errors.New("bus config: cluster: a clustered node needs a client listener")
	}
	js := c.JetStream
	if js.Storage != StorageMemory && js.Storage != StorageFile {
		return fmt.Errorf("bus config: jetstream: unknown %v", js.Storage)
	}
	if js.Replicas < 1 || js.Replicas > 5 {
		return fmt.Errorf("bus config: jetstream: replicas %d: want 1..5", js.Replicas)
	}
	if js.Enabled && c.Cluster.Listen != "" && js.StoreDir == "" {
		return errors.New("bus config: jetstream: a clustered node needs a store dir")
	}
	if js.Replicas > 1 && c.Cluster.Listen == "" {
		return fmt.Errorf("bus config: jetstream: replicas %d need a cluster", js.Replicas)
	}
	return nil
}

func (c Cluster) validate() error {
	if c.Listen == "" {
		if len(c.Routes) > 0 || c.Name != "" || !c.Auth.empty() || c.TLS.enabled() || c.Advertise != "" {
			return errors.New("routes, name, auth, tls or advertise given without a listen address")
		}
		return nil
	}
	if !nameRE.MatchString(c.Name) {
		return fmt.Errorf("name %q: want letters, digits, '-' or '_'", c.Name)
	}
	if _, _, err := splitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if c.Advertise != "" {
		if _, _, err := splitHostPort(c.Advertise); err != nil {
			return fmt.Errorf("advertise: %w", err)
		}
	}
	if err := c.Auth.validate(); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if c.Auth.Token != "" {
		return errors.New("auth: routes take a user and password, not a token")
	}
	if err := c.TLS.validate(); err != nil {
		return err
	}
	for _, r := range c.Routes {
		if _, err := routeURL(r, Auth{}); err != nil {
			return err
		}
	}
	return nil
}

// splitHostPort parses host:port with a numeric port in [0, 65535].
func splitHostPort(hp string) (string, int, error) {
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", hp, err)
	}
	p, err := strconv.Atoi(ps)
	if err != nil || p < 0 || p > 65535 {
		return "", 0, fmt.Errorf("%q: port %q: want 0..65535", hp, ps)
	}
	return host, p, nil
}

// routeURL parses a seed route and adds the cluster credentials when the
// route carries none.
func routeURL(r string, a Auth) (*url.URL, error) {
	if !strings.Contains(r, "://") {
		r = "nats-route://" + r
	}
	u, err := url.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", r, err)
	}
	if u.Scheme != "nats-route" && u.Scheme != "nats" && u.Scheme != "tls" {
		return nil, fmt.Errorf("route %q: scheme %q: want nats-route", r, u.Scheme)
	}
	if _, _, err := splitHostPort(u.Host); err != nil {
		return nil, fmt.Errorf("route: %w", err)
	}
	if u.User == nil && a.User != "" {
		u.User = url.UserPassword(a.User, a.Password)
	}
	return u, nil
}
