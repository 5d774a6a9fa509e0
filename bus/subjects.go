package bus

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Subjects builds every subject of one troupe cluster; it is the catalog
// docs/subjects.md describes. Names given to the builders (models, nodes,
// request ids, actor kinds and ids) may hold any bytes: each becomes one
// subject token through Token, so "llama-3.1" cannot split a subject in two
// and "*" cannot become a wildcard.
type Subjects struct {
	prefix  string // "troupe.<cluster>"
	cluster string
}

// NewSubjects returns the catalog for cluster, which must be letters,
// digits, '-' or '_'.
func NewSubjects(cluster string) (Subjects, error) {
	if !nameRE.MatchString(cluster) {
		return Subjects{}, fmt.Errorf("bus: cluster name %q: want letters, digits, '-' or '_'", cluster)
	}
	return Subjects{prefix: "troupe." + cluster, cluster: cluster}, nil
}

// Cluster returns the cluster name.
func (s Subjects) Cluster() string { return s.cluster }

// All matches every troupe subject of the cluster.
func (s Subjects) All() string { return s.prefix + ".>" }

// Submit is where a gateway submits a request for model to its scheduler
// (request/reply, queue group per model).
func (s Subjects) Submit(model string) string { return s.prefix + ".sched." + Token(model) + ".submit" }

// Tokens is where the scheduler streams token frames of one request to the
// gateway that submitted it.
func (s Subjects) Tokens(request string) string { return s.prefix + ".tokens." + Token(request) }

// Cancel is where a gateway cancels one request.
func (s Subjects) Cancel(request string) string { return s.prefix + ".cancel." + Token(request) }

// CancelAll matches the cancellation of every request.
func (s Subjects) CancelAll() string { return s.prefix + ".cancel.*" }

// Spawn is where node's spawner takes spawn requests (request/reply).
func (s Subjects) Spawn(node string) string { return s.prefix + ".spawn." + Token(node) }

// Stop is where node's spawner takes stop requests (request/reply).
func (s Subjects) Stop(node string) string { return s.prefix + ".stop." + Token(node) }

// Heartbeat is where node announces it is alive.
func (s Subjects) Heartbeat(node string) string { return s.prefix + ".hb." + Token(node) }

// HeartbeatAll matches every node's heartbeat.
func (s Subjects) HeartbeatAll() string { return s.prefix + ".hb.*" }

// Events is where node publishes the lifecycle events of its actors.
func (s Subjects) Events(node string) string { return s.prefix + ".events." + Token(node) }

// EventsAll matches every node's lifecycle events.
func (s Subjects) EventsAll() string { return s.prefix + ".events.*" }

// Actor is the subject prefix of one actor's endpoints; its micro service
// puts every endpoint in this group.
func (s Subjects) Actor(kind, id string) string {
	return s.prefix + ".actor." + Token(kind) + "." + Token(id)
}

// ActorEndpoint is the subject of one endpoint of one actor.
func (s Subjects) ActorEndpoint(kind, id, endpoint string) string {
	return s.Actor(kind, id) + "." + Token(endpoint)
}

// Exchange is where the ranks of group (say, the device actors whose GPUs
// form one fabric across processes) exchange small byte strings, such as
// their memory handles: request/reply, answered by rank 0 (Exchange).
func (s Subjects) Exchange(group string) string { return s.prefix + ".exchange." + Token(group) }

// KV-manager endpoint names; the KV-manager of a replica is the actor of
// kind KVManagerKind whose id is the replica.
const (
	KVManagerKind = "kvmgr"
	KVReserve     = "reserve"
	KVFree        = "free"
	KVShare       = "share"
	KVCapacity    = "capacity"
)

// KVManager is the subject of operation op of replica's KV-manager.
func (s Subjects) KVManager(replica, op string) string {
	return s.ActorEndpoint(KVManagerKind, replica, op)
}

// RegistryBucket is the JetStream KV bucket of the actor registry.
func (s Subjects) RegistryBucket() string { return "troupe_" + s.cluster + "_registry" }

// ResponsesBucket is the JetStream KV bucket of the gateways' kept
// responses (a Cache).
func (s Subjects) ResponsesBucket() string { return "troupe_" + s.cluster + "_responses" }

// Token encodes name as one subject token that is also a valid JetStream KV
// key token: letters, digits, '-' and '_' stay; every other byte becomes
// '=' and two upper-case hex digits; the empty name becomes "=". Token is
// reversible by ParseToken.
func Token(name string) string {
	if name == "" {
		return "="
	}
	if isSafe(name) {
		return name
	}
	var b strings.Builder
	b.Grow(len(name) * 3)
	for i := 0; i < len(name); i++ {
		c := name[i]
		if safeByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteString(strings.ToUpper(strconv.FormatUint(uint64(c)>>4, 16)))
		b.WriteString(strings.ToUpper(strconv.FormatUint(uint64(c)&15, 16)))
	}
	return b.String()
}

// ParseToken reverses Token.
func ParseToken(tok string) (string, error) {
	if tok == "=" {
		return "", nil
	}
	if tok == "" {
		return "", errors.New("bus: empty token")
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case safeByte(c):
			b.WriteByte(c)
		case c == '=' && i+2 < len(tok) && isHexUpper(tok[i+1]) && isHexUpper(tok[i+2]):
			v, _ := strconv.ParseUint(tok[i+1:i+3], 16, 8)
			if safeByte(byte(v)) {
				return "", fmt.Errorf("bus: token %q: byte %q needs no escape", tok, byte(v))
			}
			b.WriteByte(byte(v))
			i += 2
		default:
			return "", fmt.Errorf("bus: token %q: bad byte at %d", tok, i)
		}
	}
	return b.String(), nil
}

func isSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		if !safeByte(s[i]) {
			return false
		}
	}
	return true
}

func safeByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func isHexUpper(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }
