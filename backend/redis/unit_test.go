package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestSlotFollowsTheClusterSpec(t *testing.T) {
	// The specification's check value for CRC16/XMODEM.
	if got, want := crc16("123456789"), uint16(0x31C3); got != want {
		t.Fatalf("crc16(123456789) = %#x, want %#x", got, want)
	}
	tests := []struct {
		key  string
		same string // a key that must share its slot
	}{
		{"{user1000}.following", "user1000"},
		{"foo{}{bar}", "foo{}{bar}"}, // an empty tag is no tag: the whole key
		{"foo{{bar}}zap", "{bar"},
		{"foo{bar}{zap}", "bar"},
	}
	for _, tt := range tests {
		if slot(tt.key) != slot(tt.same) {
			t.Errorf("slot(%q) = %d, want slot(%q) = %d", tt.key, slot(tt.key), tt.same, slot(tt.same))
		}
	}
}

func TestSlotMatchesServer(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	ctx := context.Background()
	for i := range 200 {
		key := fmt.Sprintf("ceiling:rule%d:%x", i, i*7919)
		if i%10 == 0 {
			key = fmt.Sprintf("{tenant%d}:rule:%d", i, i)
		}
		want, err := client.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := slot(key); int64(got) != want {
			t.Errorf("slot(%q) = %d, server says %d", key, got, want)
		}
	}
}

func TestDecodeRejectsUnexpectedReplies(t *testing.T) {
	reqs := []backend.Request{{Key: "r:k", Limit: 3, Period: time.Second, Cost: 1}}
	tests := []struct {
		name  string
		reply any
		want  string
	}{
		{"not an array", "OK", "string, want an array"},
		{"short", []any{int64(1), int64(0)}, "2 elements, want 8"},
		{"string element", []any{int64(1), int64(0), "1", int64(2), int64(3), int64(0), int64(0), int64(0)}, "element 2 is string"},
		{"nil element", []any{int64(1), int64(0), int64(1), nil, int64(3), int64(0), int64(0), int64(0)}, "element 3 is <nil>"},
	}
	for _, tt := range tests {
		_, err := decode(tt.reply, reqs, false)
		if !errors.Is(err, errReply) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), `"r:k"`) {
			t.Errorf("%s: error %v, want errReply naming the key and %q", tt.name, err, tt.want)
		}
	}
	r, err := decode([]any{int64(7), int64(1), int64(0), int64(2), int64(5), int64(-1), int64(4), int64(0)}, reqs, false)
	if err != nil {
		t.Fatal(err)
	}
	want := backend.Result{Limit: 3, Remaining: 2, ResetAfter: 5 * time.Microsecond, RetryAfter: backend.Never, NextAfter: 4 * time.Microsecond}
	if r.now != 7 || !r.rejected || r.results[0] != want {
		t.Errorf("decode = %+v, want now 7, rejected, %+v", r, want)
	}
}

// TestRejectsWhatValidateRejects: the Store refuses the requests
// Request.Validate refuses, whose arithmetic would leave the doubles the
// script computes in, and decides every other one (see
// TestHugeGCRACostsRegression in package backendtest for the largest).
func TestRejectsWhatValidateRejects(t *testing.T) {
	s := New(targets[0].client(t))
	tests := map[string]backend.Request{
		"cost above MaxLimit":   {Key: "k", Limit: 10, Period: time.Second, Cost: backend.MaxLimit + 1, Force: true},
		"refund past MaxLimit":  {Key: "k", Limit: 10, Period: time.Second, Cost: -backend.MaxLimit - 1},
		"GCRA burst × interval": {Key: "k", Algorithm: backend.GCRA, Limit: 1, Period: backend.MaxPeriod, Burst: backend.MaxLimit, Cost: 1},
	}
	for name, r := range tests {
		if _, err := s.Decide(context.Background(), []backend.Request{r}); !errors.Is(err, backend.ErrInvalidRequest) {
			t.Errorf("%s: error %v, want ErrInvalidRequest", name, err)
		}
	}
	// The extremes Validate allows for a window algorithm stay decidable.
	r := backend.Request{Key: "k", Algorithm: backend.SlidingWindow, Limit: backend.MaxLimit, Period: backend.MaxPeriod, Cost: backend.MaxLimit}
	if res := decide(t, s, r); !res[0].Allowed || res[0].Remaining != 0 {
		t.Errorf("a full limit at the extremes: %+v, want admitted with 0 remaining", res[0])
	}
}

func TestNewPanicsOnNilClientOrRing(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2"}})
	t.Cleanup(func() { ring.Close() })
	for _, tt := range []struct {
		client redis.UniversalClient
		want   string
	}{
		{nil, "nil client"},
		{ring, "*redis.Ring"},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), tt.want) {
					t.Errorf("New(%T): recover() = %v, want a panic naming %s", tt.client, r, tt.want)
				}
			}()
			New(tt.client)
		}()
	}
}

func TestDecideIntoNeedsRoomForEveryResult(t *testing.T) {
	s := New(targets[0].client(t))
	reqs := []backend.Request{{Key: "a", Limit: 1, Period: time.Second, Cost: 1}, {Key: "b", Limit: 1, Period: time.Second, Cost: 1}}
	if err := s.DecideInto(context.Background(), reqs, make([]backend.Result, 1)); err == nil {
		t.Fatal("DecideInto with one result slot for two requests: no error")
	}
}
