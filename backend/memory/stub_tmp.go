// Package memory: PLACEHOLDER so that the root package compiles until the
// real memory store lands. The memory helper deletes this file when it lands
// backend/memory (git rm backend/memory/stub_tmp.go).
package memory

import (
	"context"
	"errors"

	"github.com/ceiling-go/ceiling/backend"
)

// Store is a placeholder.
type Store struct{}

// New is a placeholder.
func New() *Store { return &Store{} }

// Decide is a placeholder that always fails.
func (*Store) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	return nil, errors.New("memory: placeholder store")
}

// Reset is a placeholder.
func (*Store) Reset(ctx context.Context, keys ...string) error { return nil }
