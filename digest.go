package ceiling

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"strings"
	"sync"
	"unsafe"

	"github.com/ceiling-go/ceiling/backend/memory"
)

// keyHasher is the capability of a backend that keeps nothing of a key but
// a hash under seeds of its own, and no reference to the key's string once
// its call returns: for it a digest buys no privacy, and the stored key is
// built without an allocation (see [Limiter.storedKey]).
type keyHasher interface {
	HashesKeys() bool
}

var _ keyHasher = (*memory.Store)(nil)

// digestLen is how many bytes of the SHA-256 (or HMAC) of a key value a
// stored key's tag keeps: 128 bits, so collisions are out of reach while
// keys stay short.
const digestLen = 16

// digester turns a key value into the fixed-length tag of a stored key.
type digester struct {
	macs    *sync.Pool // nil without a secret
	warning string     // for the health report: no secret, remote backend
}

// noSecretWarning is the warning a limiter with a remote backend and no key
// secret logs at start and keeps in its health report.
const noSecretWarning = "no key secret (WithKeySecret) with a remote backend: stored keys are plain SHA-256 digests, " +
	"and anyone who reads the backend can recover IP addresses, phone numbers and user ids by hashing candidates; " +
	"set a secret of at least 32 random bytes, the same on every instance"

// newDigester returns the limiter's digester, for its key secret if it has
// one, warning once about a remote backend without one.
func (l *Limiter) newDigester() digester {
	var d digester
	if secret := l.cfg.secret; len(secret) > 0 {
		d.macs = &sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}
	} else if l.remote {
		d.warning = noSecretWarning
		l.cfg.logger.Warn("ceiling: " + noSecretWarning)
	}
	return d
}

// keyWarnings are the health warnings about keys: this limiter's stored
// keys, and the process-wide ones of key functions (clientip.go).
func (l *Limiter) keyWarnings() []string {
	w := keyFuncWarnings()
	if l.digest.warning != "" {
		w = append([]string{l.digest.warning}, w...)
	}
	return w
}

// storedKey returns "{tag}:rule" for a key value, tag being 128 bits of its
// HMAC-SHA256 under the key secret (SHA-256 without one): fixed length, no
// raw identifier, no user byte that could pick a Redis Cluster slot. The
// tag is a hash tag, so every rule keyed by one value is stored in one slot
// and decided in one script, at the price of showing a backend reader which
// keys belong to one (unnamed) caller.
//
// A [keyHasher] backend gets "rule\x00value" instead, built in st's key
// arena: valid only while st is out of the pool, so whatever keeps a
// request past its decision copies it ([Limiter.kept]).
func (l *Limiter) storedKey(st *state, rule, value string) string {
	if l.rawKeys {
		start := len(st.keys)
		st.keys = append(st.keys, rule...)
		st.keys = append(st.keys, 0)
		st.keys = append(st.keys, value...)
		k := st.keys[start:]
		return unsafe.String(&k[0], len(k))
	}
	var sum [sha256.Size]byte
	st.buf = append(st.buf[:0], value...)
	if l.digest.macs == nil {
		sum = sha256.Sum256(st.buf)
	} else {
		m := l.digest.macs.Get().(hash.Hash)
		m.Reset()
		m.Write(st.buf)
		st.buf = m.Sum(st.buf[:0])
		copy(sum[:], st.buf)
		l.digest.macs.Put(m)
	}
	st.buf = append(st.buf[:0], '{')
	st.buf = base64.RawURLEncoding.AppendEncode(st.buf, sum[:digestLen])
	st.buf = append(st.buf, '}', ':')
	st.buf = append(st.buf, rule...)
	return string(st.buf)
}

// kept returns a stored key that outlives the state it was built in: a
// copy of a key from st's arena, else the key itself.
func (l *Limiter) kept(key string) string {
	if l.rawKeys {
		return strings.Clone(key)
	}
	return key
}
