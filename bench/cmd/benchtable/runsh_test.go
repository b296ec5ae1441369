package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// bench/run.sh, end to end with a stand-in for the benchmark binary: it
// says which step of how many it is on with the time elapsed, keeps the
// raw output, and draws the charts the tables embed, so that the next run
// regenerates BENCHMARKS.md's charts with its tables.
func TestRunShShowsProgressAndRegeneratesCharts(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CEILING_REQUIRE_REDIS") != "" {
			t.Fatal("redis-server is not on PATH and CEILING_REQUIRE_REDIS is set")
		}
		t.Skip("run.sh starts a redis-server, and none is on PATH")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "bench.test")
	script := "#!/bin/sh\ncat <<'EOF'\n" + chartSample + "EOF\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	cmd := exec.Command("bash", "../../run.sh")
	cmd.Env = append(os.Environ(), "COUNT=2", "BENCH_BINARY="+fake, "OUT_DIR="+out)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run.sh: %v\n%s", err, b)
	}
	log := string(b)

	steps := regexp.MustCompile(`(?m)^== step (\d) of (\d) \(\d+m\d\ds elapsed\): (.+)$`).FindAllStringSubmatch(log, -1)
	var got []string
	for _, s := range steps {
		got = append(got, s[1]+"/"+s[2])
	}
	if want := "1/8 2/8 3/8 4/8 5/8 6/8 7/8 8/8"; strings.Join(got, " ") != want {
		t.Errorf("steps = %v, want %s:\n%s", got, want, log)
	}
	raw, err := os.ReadFile(filepath.Join(out, "results.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "BenchmarkKeys1M/httprate-2") || !strings.HasPrefix(string(raw), "machine: ") {
		t.Errorf("results.txt is not the run's raw output:\n%s", raw)
	}
	for _, f := range []string{"decide.svg", "middleware.svg", "redis.svg", "memory.svg"} {
		svg, err := os.ReadFile(filepath.Join(out, "charts", f))
		if err != nil {
			t.Fatal(err)
		}
		if len(parseSVG(t, string(svg))) == 0 {
			t.Errorf("%s has no bars", f)
		}
		if !strings.Contains(log, "]("+filepath.Join(out, "charts", f)+")") {
			t.Errorf("the tables do not embed %s:\n%s", f, log)
		}
	}
}

// An experiment that fails (a timing check on a loaded machine) does not
// cost the run its tables: run.sh prints them from what ran, then names
// the failure and exits 1.
func TestRunShPrintsTablesWhenAnExperimentFails(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CEILING_REQUIRE_REDIS") != "" {
			t.Fatal("redis-server is not on PATH and CEILING_REQUIRE_REDIS is set")
		}
		t.Skip("run.sh starts a redis-server, and none is on PATH")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "bench.test")
	script := "#!/bin/sh\ncat <<'EOF'\n" + chartSample + "EOF\ncase \"$*\" in *Boundary*) echo '--- FAIL: BenchmarkBoundary'; exit 1;; esac\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "../../run.sh")
	cmd.Env = append(os.Environ(), "COUNT=1", "BENCH_BINARY="+fake, "OUT_DIR="+filepath.Join(dir, "out"))
	b, err := cmd.CombinedOutput()
	log := string(b)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("run.sh with a failing experiment: %v, want exit status 1\n%s", err, log)
	}
	if !strings.Contains(log, "## Tables") || !strings.Contains(log, "experiments failed: Exact|Attack|Boundary|Keys1M") {
		t.Errorf("run.sh did not print the tables and name the failed experiments:\n%s", log)
	}
}
