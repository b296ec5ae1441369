package ceiling

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"sync"
)

// digestLen is how many bytes of the SHA-256 (or HMAC) a stored key keeps:
// 128 bits, so collisions are out of reach while keys stay short.
const digestLen = 16

// digester turns a key value into the fixed-length part of a stored key.
type digester struct {
	macs *sync.Pool // nil without a secret
}

func newDigester(secret []byte) digester {
	if len(secret) == 0 {
		return digester{}
	}
	return digester{macs: &sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}}
}

// storedKey returns "rule:digest" for a key value: fixed length, no raw
// identifier, and no user byte that could pick a Redis Cluster slot.
//
// The memory store keeps nothing of a key but a 128-bit hash under seeds
// random to the process, so for it the digest buys no privacy and costs a
// quarter of the middleware's time: it gets "rule\x00value" instead (rule
// names cannot hold a NUL, so the join is unambiguous).
func (l *Limiter) storedKey(st *state, rule, value string) string {
	if l.rawKeys {
		st.buf = append(st.buf[:0], rule...)
		st.buf = append(st.buf, 0)
		st.buf = append(st.buf, value...)
		return string(st.buf)
	}
	var sum [sha256.Size]byte
	if l.digest.macs == nil {
		st.buf = append(st.buf[:0], value...)
		sum = sha256.Sum256(st.buf)
	} else {
		m := l.digest.macs.Get().(hash.Hash)
		m.Reset()
		st.buf = append(st.buf[:0], value...)
		m.Write(st.buf)
		st.buf = m.Sum(st.buf[:0])
		copy(sum[:], st.buf)
		l.digest.macs.Put(m)
	}
	st.buf = append(st.buf[:0], rule...)
	st.buf = append(st.buf, ':')
	st.buf = base64.RawURLEncoding.AppendEncode(st.buf, sum[:digestLen])
	return string(st.buf)
}
