package pgtest

import (
	"context"
	"os"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestSharedDatabases starts the shared server and gives two tests'
// databases apart.
func TestSharedDatabases(t *testing.T) {
	s := Shared(t)
	a, b := s.Database(t), s.Database(t)
	if a == b {
		t.Fatalf("two databases share the URL %s", a)
	}
	p := Pool(t, a)
	var one int
	if err := p.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
}

// TestRestart kills a server and starts it again on its port.
func TestRestart(t *testing.T) {
	s := Start(t, Options{})
	p := Pool(t, s.Database(t))
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := p.Ping(context.Background()); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}
