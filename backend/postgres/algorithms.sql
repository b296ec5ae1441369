-- The algorithms of backend/ALGORITHMS.md in PL/pgSQL, one function each,
-- transcribed from the same integer definitions as the memory store and
-- lib.lua: bigint throughout, numeric only where cost × emission interval
-- can pass 2^63 (GCRA), floor division on non-negative operands only.
--
-- A state is a bigint[] whose layout is the algorithm's (NULL: absent):
--   0 rolling window  {W, last, n0 .. n16}
--   1 sliding log     {t1, n1, t2, n2, ...}   runs oldest first
--   2 sliding window  {start, prev, cur}
--   3 fixed window    {start, count}
--   4 GCRA            {tat, at, T}   T: the emission interval of the write
--   5 concurrency     {at, id1, n1, exp1, id2, n2, exp2, ...}
--
-- Every step function decides one request on its key's state at now (µs)
-- and returns ok, the raw remaining, reset, retry (-1 never) and next that
-- ceiling_decide clamps as ALGORITHMS.md says, the stamp, and the state
-- the request writes (meaningful when ok and c <> 0) with the instant it is
-- back to full.

CREATE OR REPLACE FUNCTION ceiling_gcra(s bigint[], now bigint, lim bigint, p bigint, burst bigint, c bigint, force boolean, stamp bigint,
  OUT ok boolean, OUT remaining bigint, OUT reset bigint, OUT retry bigint, OUT nxt bigint, OUT placed bigint, OUT st bigint[], OUT exp bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  b bigint := CASE WHEN burst = 0 THEN lim ELSE burst END;
  t bigint := (p + lim - 1) / lim;
  tau bigint := t * b;
  t0 bigint;
  nt numeric;
  over numeric;
  d bigint;
  ts bigint;
  u bigint;
  n bigint;
BEGIN
  ok := true; retry := 0; placed := 0;
  IF s IS NOT NULL AND s[3] IS NULL THEN
    s := NULL; -- another layout: absent
  END IF;
  t0 := greatest(coalesce(s[1], now), now);
  IF s IS NOT NULL AND s[3] <> t AND s[1] > now THEN
    -- Another rate (ALGORITHMS.md): the debt is u units of the write's
    -- interval ts, decided under this request's burst.
    d := s[1] - now;
    ts := s[3];
    u := (d + ts - 1) / ts;
    remaining := greatest(0, b - u);
    nxt := CASE WHEN remaining = 0 THEN d - (b - 1) * ts ELSE 0 END;
    reset := d;
    IF c > 0 AND NOT force AND (c > b OR u + c > b) THEN
      ok := false;
      retry := CASE WHEN c <= b THEN d - (b - c) * ts ELSE -1 END;
      RETURN;
    END IF;
    IF c = 0 THEN st := s; exp := s[1]; RETURN; END IF;
    n := CASE WHEN c > 0 THEN u + c WHEN stamp = 0 THEN u - least(-c, u) ELSE u END;
    exp := now + least(n::numeric * t, 4503599627370496)::bigint;
    st := ARRAY[exp, now, t];
    remaining := greatest(0, (tau - (exp - now)) / t);
    reset := exp - now;
    nxt := (exp - now) - tau + t;
    IF c > 0 THEN placed := exp; END IF;
    RETURN;
  END IF;
  IF c > 0 THEN
    nt := t0::numeric + c::numeric * t;
    over := nt - now - tau;
    IF NOT force AND (c > b OR over > 0) THEN
      ok := false;
      retry := CASE WHEN c <= b THEN over::bigint ELSE -1 END;
      remaining := (tau - (t0 - now)) / t;
      reset := t0 - now;
      nxt := (t0 - now) - tau + t;
      RETURN;
    END IF;
    nt := least(nt, now::numeric + 4503599627370496);
  ELSIF c = 0 THEN
    nt := t0;
  ELSIF stamp = 0 THEN
    nt := greatest(t0::numeric + c::numeric * t, now);
  ELSE
    nt := greatest(t0 - least(-c::numeric * t, greatest(0, stamp - now)), now);
  END IF;
  exp := nt::bigint;
  st := ARRAY[exp, now, t];
  remaining := (tau - (exp - now)) / t;
  IF remaining < 0 THEN remaining := 0; END IF;
  reset := exp - now;
  nxt := (exp - now) - tau + t;
  IF c > 0 THEN placed := exp; END IF;
END $$;

CREATE OR REPLACE FUNCTION ceiling_fixed(s bigint[], now bigint, lim bigint, p bigint, c bigint, force boolean, stamp bigint,
  OUT ok boolean, OUT remaining bigint, OUT reset bigint, OUT retry bigint, OUT nxt bigint, OUT placed bigint, OUT st bigint[], OUT exp bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  ws bigint := now - ((now % p) + p) % p;
  fin bigint := ws + p;
  cnt bigint := 0;
BEGIN
  ok := true; retry := 0; placed := 0;
  IF s IS NOT NULL AND s[1] = ws THEN cnt := s[2]; END IF;
  IF c > 0 AND NOT force AND cnt + c > lim THEN
    ok := false;
    retry := CASE WHEN c > lim THEN -1 ELSE fin - now END;
    remaining := lim - cnt;
    reset := CASE WHEN cnt > 0 THEN fin - now ELSE 0 END;
    nxt := fin - now;
    RETURN;
  END IF;
  IF c < 0 AND stamp <> 0 AND stamp - ((stamp % p) + p) % p <> ws THEN
    c := 0; -- the stamp's window is over: its units no longer count
  END IF;
  cnt := least(1099511627776, greatest(0, cnt + c));
  st := ARRAY[ws, cnt];
  exp := CASE WHEN cnt = 0 THEN now ELSE fin END;
  remaining := lim - cnt;
  reset := CASE WHEN cnt > 0 THEN fin - now ELSE 0 END;
  nxt := fin - now;
  IF c > 0 THEN placed := now; END IF;
END $$;

-- ceiling_sliding_wait is the sliding window's retry for c units
-- (c <= lim), rem µs before the window ends.
CREATE OR REPLACE FUNCTION ceiling_sliding_wait(lim bigint, p bigint, pm bigint, rem bigint, prev bigint, cur bigint, c bigint)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  x bigint;
  r bigint;
BEGIN
  IF cur + c <= lim THEN
    x := least(1000000, (lim - cur - c) * 1000000 / prev);
    r := ((x + 1) * pm + 999999) / 1000000 - 1;
    RETURN rem - ((r + 1) * 1000 - 1);
  END IF;
  x := least(1000000, (lim - c) * 1000000 / cur);
  r := ((x + 1) * pm + 999999) / 1000000 - 1;
  IF r >= pm THEN RETURN rem; END IF;
  RETURN rem + p - ((r + 1) * 1000 - 1);
END $$;

CREATE OR REPLACE FUNCTION ceiling_sliding(s bigint[], now bigint, lim bigint, p bigint, c bigint, force boolean, stamp bigint,
  OUT ok boolean, OUT remaining bigint, OUT reset bigint, OUT retry bigint, OUT nxt bigint, OUT placed bigint, OUT st bigint[], OUT exp bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  ws bigint := now - ((now % p) + p) % p;
  prev bigint := 0;
  cur bigint := 0;
  rem bigint := ws + p - now;
  pm bigint := p / 1000;
  w bigint := (rem / 1000) * 1000000 / (p / 1000);
  sw bigint;
BEGIN
  ok := true; retry := 0; placed := 0;
  IF s IS NOT NULL AND s[1] = ws THEN
    prev := s[2]; cur := s[3];
  ELSIF s IS NOT NULL AND s[1] = ws - p THEN
    prev := s[3];
  END IF;
  IF c > 0 AND NOT force AND prev * w + (cur + c) * 1000000 > lim * 1000000 THEN
    ok := false;
    retry := CASE WHEN c <= lim THEN ceiling_sliding_wait(lim, p, pm, rem, prev, cur, c) ELSE -1 END;
  ELSE
    IF c < 0 AND stamp <> 0 THEN
      sw := stamp - ((stamp % p) + p) % p;
      IF sw = ws THEN
        cur := cur - least(-c, cur);
      ELSIF sw = ws - p THEN
        prev := prev - least(-c, prev);
      END IF;
      c := 0;
    END IF;
    cur := least(1099511627776, greatest(0, cur + c));
    st := ARRAY[ws, prev, cur];
    exp := CASE WHEN cur > 0 THEN ws + 2 * p WHEN prev > 0 THEN ws + p ELSE now END;
    IF c > 0 THEN placed := now; END IF;
  END IF;
  remaining := lim * 1000000 - (prev * w + cur * 1000000);
  remaining := CASE WHEN remaining < 0 THEN -((-remaining + 999999) / 1000000) ELSE remaining / 1000000 END;
  reset := CASE WHEN cur > 0 THEN rem + p WHEN prev > 0 THEN rem ELSE 0 END;
  nxt := CASE WHEN remaining > 0 THEN 0 ELSE ceiling_sliding_wait(lim, p, pm, rem, prev, cur, 1) END;
END $$;

CREATE OR REPLACE FUNCTION ceiling_log(s bigint[], now bigint, lim bigint, p bigint, c bigint, force boolean, stamp bigint,
  OUT ok boolean, OUT remaining bigint, OUT reset bigint, OUT retry bigint, OUT nxt bigint, OUT placed bigint, OUT st bigint[], OUT exp bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  lg bigint[] := '{}';
  k bigint := 0;
  m int;
  i int;
  j bigint;
  take bigint;
  g bigint;
BEGIN
  ok := true; retry := 0; placed := 0;
  IF s IS NOT NULL THEN
    FOR i IN 1 .. cardinality(s) / 2 LOOP
      IF s[2 * i - 1] + p > now THEN -- a unit counts while now < e + P
        lg := lg || s[2 * i - 1] || s[2 * i];
        k := k + s[2 * i];
      END IF;
    END LOOP;
  END IF;
  m := cardinality(lg) / 2;
  IF c > 0 AND NOT force AND k + c > lim THEN
    ok := false;
    retry := -1;
    IF c <= lim THEN
      j := k + c - lim - 1; -- the unit whose expiry makes room
      FOR i IN 1 .. m LOOP
        IF j < lg[2 * i] THEN retry := lg[2 * i - 1] + p - now; EXIT; END IF;
        j := j - lg[2 * i];
      END LOOP;
    END IF;
  ELSIF c > 0 THEN
    IF m > 0 AND lg[2 * m - 1] = now THEN
      lg[2 * m] := lg[2 * m] + c;
    ELSE
      lg := lg || now || c;
    END IF;
    placed := now;
  ELSIF c < 0 AND stamp <> 0 THEN
    FOR i IN 1 .. m LOOP
      IF lg[2 * i - 1] = stamp THEN
        lg[2 * i] := lg[2 * i] - least(-c, lg[2 * i]);
        IF lg[2 * i] = 0 THEN lg := lg[1 : 2 * i - 2] || lg[2 * i + 1 :]; END IF;
        EXIT;
      END IF;
    END LOOP;
  ELSIF c < 0 THEN
    take := least(-c, k);
    WHILE take > 0 LOOP
      m := cardinality(lg) / 2;
      g := least(take, lg[2 * m]);
      lg[2 * m] := lg[2 * m] - g;
      take := take - g;
      IF lg[2 * m] = 0 THEN lg := lg[1 : 2 * m - 2]; END IF;
    END LOOP;
  END IF;
  IF ok THEN
    st := lg;
    m := cardinality(lg) / 2;
    exp := CASE WHEN m > 0 THEN lg[2 * m - 1] + p ELSE now END;
  END IF;
  -- after: on the log as the request leaves it (rejected: unchanged)
  m := cardinality(lg) / 2;
  k := 0;
  FOR i IN 1 .. m LOOP k := k + lg[2 * i]; END LOOP;
  remaining := lim - k;
  reset := CASE WHEN k > 0 THEN lg[2 * m - 1] + p - now ELSE 0 END;
  nxt := 0;
  IF k >= lim THEN
    j := k - lim;
    FOR i IN 1 .. m LOOP
      IF j < lg[2 * i] THEN nxt := lg[2 * i - 1] + p - now; EXIT; END IF;
      j := j - lg[2 * i];
    END LOOP;
  END IF;
END $$;

CREATE OR REPLACE FUNCTION ceiling_rolling(s bigint[], now bigint, lim bigint, p bigint, c bigint, force boolean, stamp bigint,
  OUT ok boolean, OUT remaining bigint, OUT reset bigint, OUT retry bigint, OUT nxt bigint, OUT placed bigint, OUT st bigint[], OUT exp bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  w bigint := (p + 15) / 16;
  n bigint[] := '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'; -- n[1 + i] is bucket b - 16 + i
  last bigint := 0;
  b bigint;
  d bigint;
  total bigint := 0;
  i int;
  h int;
  g bigint;
  t bigint;
  newer bigint;
  x bigint;
BEGIN
  ok := true; retry := 0; placed := 0;
  IF s IS NOT NULL AND s[1] = w THEN
    n := s[3 : 19];
    last := s[2];
  END IF;
  b := greatest(now / w, last);
  d := b - last;
  IF d > 16 THEN
    n := '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}';
  ELSIF d > 0 THEN
    n := n[1 + d : 17] || array_fill(0::bigint, ARRAY[d::int]);
  END IF;
  FOR i IN 1 .. 17 LOOP total := total + n[i]; END LOOP;
  IF c > 0 AND NOT force AND total + c > lim THEN
    ok := false;
    retry := -1;
    IF c <= lim THEN
      x := lim - c;
      newer := total;
      FOR i IN 0 .. 16 LOOP
        newer := newer - n[1 + i];
        IF newer <= x THEN retry := (b + i + 1) * w - now; EXIT; END IF;
      END LOOP;
    END IF;
  ELSIF c > 0 THEN
    t := least(4294967295, n[17] + c);
    total := total + t - n[17];
    n[17] := t;
    placed := b * w;
  ELSIF c < 0 AND stamp <> 0 THEN
    d := stamp / w - b + 16; -- only the stamp's bucket, while it counts
    IF 0 <= d AND d <= 16 THEN n[1 + d] := n[1 + d] - least(-c, n[1 + d]); END IF;
  ELSIF c < 0 THEN
    g := -c;
    FOR i IN REVERSE 17 .. 1 LOOP
      t := least(g, n[i]);
      n[i] := n[i] - t;
      g := g - t;
    END LOOP;
  END IF;
  IF placed > 0 THEN
    h := 16; -- units just placed in the newest slot, total kept up to date
  ELSE
    total := 0;
    h := -1;
    FOR i IN 0 .. 16 LOOP
      total := total + n[1 + i];
      IF n[1 + i] > 0 THEN h := i; END IF;
    END LOOP;
  END IF;
  remaining := lim - total;
  reset := CASE WHEN total > 0 THEN (b + h + 1) * w - now ELSE 0 END;
  nxt := 0;
  IF total >= lim THEN
    newer := total;
    FOR i IN 0 .. 16 LOOP
      newer := newer - n[1 + i];
      IF newer <= lim - 1 THEN nxt := (b + i + 1) * w - now; EXIT; END IF;
    END LOOP;
  END IF;
  IF ok THEN
    st := ARRAY[w, b] || n;
    exp := CASE WHEN total > 0 THEN (b + h + 1) * w ELSE now END;
  END IF;
END $$;

CREATE OR REPLACE FUNCTION ceiling_leases(s bigint[], now bigint, lim bigint, p bigint, c bigint, force boolean, lease bigint,
  OUT ok boolean, OUT remaining bigint, OUT reset bigint, OUT retry bigint, OUT nxt bigint, OUT placed bigint, OUT st bigint[], OUT exp bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  ls bigint[] := '{}'; -- live leases: id, n, exp
  cnt bigint := 0;
  m int;
  i int;
  found int := 0;
BEGIN
  ok := true; retry := 0; placed := 0;
  IF s IS NOT NULL THEN
    FOR i IN 0 .. (cardinality(s) - 1) / 3 - 1 LOOP
      IF now < s[4 + 3 * i] THEN
        ls := ls || s[2 + 3 * i : 4 + 3 * i];
        cnt := cnt + s[3 + 3 * i];
      END IF;
    END LOOP;
  END IF;
  m := cardinality(ls) / 3;
  FOR i IN 0 .. m - 1 LOOP
    IF ls[1 + 3 * i] = lease THEN found := i + 1; EXIT; END IF;
  END LOOP;
  IF c > 0 AND found > 0 THEN
    ls[3 * found] := now + p; -- a renewal
  ELSIF c > 0 AND NOT force AND cnt + c > lim THEN
    ok := false;
    retry := CASE WHEN c <= lim THEN ceiling_leases_wait(ls, now, lim, cnt, c) ELSE -1 END;
  ELSIF c > 0 THEN
    ls := ls || lease || c || (now + p);
    cnt := cnt + c;
  ELSIF c < 0 AND found > 0 THEN
    IF ls[3 * found - 1] + c <= 0 THEN
      cnt := cnt - ls[3 * found - 1];
      ls := ls[1 : 3 * found - 3] || ls[3 * found + 1 :];
    ELSE
      ls[3 * found - 1] := ls[3 * found - 1] + c;
      cnt := cnt + c;
    END IF;
  END IF;
  m := cardinality(ls) / 3;
  reset := 0;
  FOR i IN 0 .. m - 1 LOOP reset := greatest(reset, ls[3 + 3 * i] - now); END LOOP;
  remaining := lim - cnt;
  nxt := CASE WHEN cnt >= lim THEN ceiling_leases_wait(ls, now, lim, cnt, 1) ELSE 0 END;
  IF ok THEN
    st := ARRAY[now] || ls;
    exp := now + reset;
  END IF;
END $$;

-- ceiling_leases_wait is when enough live leases (id, n, exp triples)
-- expire for x more units while cnt are held.
CREATE OR REPLACE FUNCTION ceiling_leases_wait(ls bigint[], now bigint, lim bigint, cnt bigint, x bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce(min(e) - now, 0) FROM (
    SELECT e, cnt - sum(n) OVER (ORDER BY e RANGE UNBOUNDED PRECEDING) + x <= lim AS fits
    FROM (SELECT ls[3 * i + 2] AS n, ls[3 * i + 3] AS e FROM generate_series(0, cardinality(ls) / 3 - 1) i) l
  ) f WHERE fits
$$;

-- ceiling_anchor reads state s of algorithm alg, under period p, at now
-- when the clock is behind it (ALGORITHMS.md): changed reports whether it
-- did, st and exp are the anchored state and when it is back to full.
CREATE OR REPLACE FUNCTION ceiling_anchor(alg int, s bigint[], now bigint, p bigint, OUT changed boolean, OUT st bigint[], OUT exp bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  ws bigint := now - ((now % p) + p) % p;
  w bigint;
  cur bigint;
  e bigint;
  d bigint;
  m int;
  i int;
  h int;
  merged bigint[];
BEGIN
  changed := false;
  CASE alg
  WHEN 4 THEN
    IF s[2] > now THEN
      changed := true;
      exp := s[1] - (s[2] - now);
      st := ARRAY[exp, now, s[3]];
    END IF;
  WHEN 3, 2 THEN
    IF s[1] > now THEN
      changed := true;
      st := s;
      st[1] := ws;
      exp := CASE WHEN alg = 2 AND s[3] > 0 THEN ws + 2 * p ELSE ws + p END;
    END IF;
  WHEN 1 THEN
    m := cardinality(s) / 2;
    IF m > 0 AND s[2 * m - 1] > now THEN
      changed := true;
      st := '{}';
      FOR i IN 1 .. m LOOP
        IF s[2 * i - 1] < now THEN
          st := st || s[2 * i - 1] || s[2 * i];
        ELSIF cardinality(st) > 0 AND st[cardinality(st) - 1] = now THEN
          st[cardinality(st)] := st[cardinality(st)] + s[2 * i];
        ELSE
          st := st || now || s[2 * i];
        END IF;
      END LOOP;
      exp := now + p;
    END IF;
  WHEN 0 THEN
    w := (p + 15) / 16;
    cur := now / w;
    IF s[1] = w AND s[2] > cur THEN
      changed := true;
      e := s[2] - cur;
      merged := array_fill(0::bigint, ARRAY[17]);
      FOR i IN 0 .. 16 LOOP
        merged[1 + least(i + e, 16)] := merged[1 + least(i + e, 16)] + s[3 + i];
      END LOOP;
      merged[17] := least(4294967295, merged[17]);
      st := ARRAY[w, cur] || merged;
      exp := now;
      FOR h IN REVERSE 16 .. 0 LOOP
        IF merged[1 + h] > 0 THEN exp := (cur + h + 1) * w; EXIT; END IF;
      END LOOP;
    END IF;
  WHEN 5 THEN
    d := greatest(0, s[1] - now);
    st := ARRAY[now];
    exp := now;
    FOR i IN 0 .. (cardinality(s) - 1) / 3 - 1 LOOP
      IF s[4 + 3 * i] - d > now THEN
        st := st || s[2 + 3 * i] || s[3 + 3 * i] || (s[4 + 3 * i] - d);
        exp := greatest(exp, s[4 + 3 * i] - d);
      END IF;
    END LOOP;
    changed := d > 0 OR cardinality(st) <> cardinality(s);
  ELSE
  END CASE;
END $$;
