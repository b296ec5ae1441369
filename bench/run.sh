#!/usr/bin/env bash
# Runs every benchmark of the bench module against a redis-server of its own
# (a free loopback port, never 6379; stopped by PID on exit) and prints the
# tables of BENCHMARKS.md, ratios included, from this one run. It keeps the
# run's raw output in bench/results.txt and draws its charts into
# bench/charts/, which the tables embed: paste the tables into BENCHMARKS.md
# and commit all three together.
#
#   bench/run.sh            # about four minutes on 2 cores
#   COUNT=1 BENCHTIME=50ms bench/run.sh   # quicker, noisier
#
# It prints each step as "step k of n" with the time elapsed. BENCH_BINARY
# (a prebuilt benchmark binary) and OUT_DIR (where results.txt and charts/
# go) exist for its own test.
set -euo pipefail
cd "$(dirname "$0")"

COUNT=${COUNT:-3}
BENCHTIME=${BENCHTIME:-100ms}
OUT_DIR=${OUT_DIR:-}
work=$(mktemp -d)

steps=$((COUNT + 6))
step_no=0
# step announces the next step with the time elapsed since the start.
step() {
	step_no=$((step_no + 1))
	printf '== step %d of %d (%dm%02ds elapsed): %s\n' "$step_no" "$steps" $((SECONDS / 60)) $((SECONDS % 60)) "$*"
}
redis_pid=
cleanup() {
	if [ -n "$redis_pid" ]; then
		kill "$redis_pid" 2>/dev/null || true
		wait "$redis_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

command -v redis-server >/dev/null || { echo "run.sh: redis-server not found on PATH" >&2; exit 1; }

step "start redis-server on a free loopback port"

# A free loopback port: try a few random ones until a server starts on one.
for _ in 1 2 3 4 5 6 7 8 9 10; do
	port=$((20000 + RANDOM % 30000))
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		continue # somebody listens there
	fi
	redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
		--dir "$work" --logfile "$work/redis.log" --daemonize no &
	redis_pid=$!
	for _ in $(seq 50); do
		if redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1; then
			break 2
		fi
		if ! kill -0 "$redis_pid" 2>/dev/null; then
			break
		fi
		sleep 0.1
	done
	kill "$redis_pid" 2>/dev/null || true
	wait "$redis_pid" 2>/dev/null || true
	redis_pid=
done
[ -n "$redis_pid" ] || { echo "run.sh: could not start redis-server" >&2; exit 1; }
export CEILING_BENCH_REDIS="127.0.0.1:$port"

step "compile the benchmarks"
if [ -n "${BENCH_BINARY:-}" ]; then
	cp "$BENCH_BINARY" "$work/bench.test"
else
	go test -c -o "$work/bench.test" .
fi
step "build bench/cmd/benchtable and bench/cmd/benchrounds"
go build -o "$work/benchtable" ./cmd/benchtable
go build -o "$work/benchrounds" ./cmd/benchrounds

{
	echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "$(go version), $(redis-server --version | cut -d' ' -f1-3) on $CEILING_BENCH_REDIS"
} | tee "$work/out.txt"

# Timed benchmarks: $COUNT rounds of the whole suite, $BENCHTIME each, so
# that a burst of load from elsewhere hits one sample of a library rather
# than all of them; the tables keep each benchmark's fastest round.
for round in $(seq "$COUNT"); do
	step "timed benchmarks, round $round of $COUNT (decision, middleware, Redis, Redis keys)"
	echo "round $round of $COUNT" >>"$work/out.txt"
	"$work/bench.test" -test.run '^$' -test.bench '^Benchmark(Decide|Middleware|Redis|RedisKeys)$' \
		-test.benchtime "$BENCHTIME" | tee -a "$work/out.txt"
done
# Pinned: the Redis keys benchmark once more with redis-server on CPU 1
# and the benchmark on CPU 0 (GOMAXPROCS=1), so that the client's CPU per
# decision, not two processes sharing cores, sets the throughput. Its
# variants are renamed serial-pinned and parallel64-pinned: the tables
# show them as columns of their own.
step "pinned: redis-server on CPU 1, the Redis keys benchmark on CPU 0"
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
	echo "pinned" >>"$work/out.txt"
	taskset -a -cp 1 "$redis_pid" >/dev/null
	GOMAXPROCS=1 taskset -c 0 "$work/bench.test" -test.run '^$' -test.bench '^BenchmarkRedisKeys$' \
		-test.benchtime "$BENCHTIME" | sed -E 's#/(serial|parallel64)/#/\1-pinned/#' | tee -a "$work/out.txt"
	taskset -a -cp "0-$(($(nproc) - 1))" "$redis_pid" >/dev/null
else
	echo "skipped: needs taskset and 2 cores"
fi
# Experiments: one run each. The scripts' server time is read over 20,000
# calls on a redis-server of its own.
step "experiments, once each (exactness, attack, boundary, 1M keys, scripts' server time)"
echo "experiments" >>"$work/out.txt"
# An experiment that fails (a timing check on a loaded machine) is named at
# the end, and the run exits 1, but the tables of what ran are printed.
failed=
"$work/bench.test" -test.run '^$' -test.bench '^Benchmark(Exact|Attack|Boundary|Keys1M)$' \
	-test.benchtime 1x | tee -a "$work/out.txt" || failed="$failed Exact|Attack|Boundary|Keys1M"
"$work/bench.test" -test.run '^$' -test.bench '^BenchmarkScriptServerTime$' \
	-test.benchtime 20000x | tee -a "$work/out.txt" || failed="$failed ScriptServerTime"

step "tables and charts"
if [ -n "$OUT_DIR" ]; then
	charts=$OUT_DIR/charts chart_path=$OUT_DIR/charts results=$OUT_DIR/results.txt
else
	charts=charts chart_path=bench/charts results=results.txt
fi
mkdir -p "$(dirname "$results")"
cp "$work/out.txt" "$results"
echo
echo "## Tables (ratios: ceiling ÷ best peer, from this run; below 1 means ceiling is better)"
"$work/benchtable" -charts "$charts" -chart-path "$chart_path" <"$results"
echo
echo "## How stable each column is (from the same rounds)"
echo
"$work/benchrounds" <"$results"
echo
echo "done in $((SECONDS / 60))m$(printf '%02d' $((SECONDS % 60)))s: raw output in $results, charts in $charts/ (to redraw the charts from it: cd bench && go run ./cmd/benchtable -charts charts -chart-path bench/charts <results.txt)"
if [ -n "$failed" ]; then
	echo "run.sh: experiments failed:$failed (their FAIL lines are in $results)" >&2
	exit 1
fi
