-- ceiling_decide decides one Decide call all or nothing, in the caller's
-- one statement (one round trip), on the server's clock unless p_now is
-- given (tests).
--
-- It locks every key of the call first, in sorted order, with one INSERT
-- ... ON CONFLICT DO UPDATE that creates the rows it lacks: two calls on
-- the same keys, whatever their rule order, queue on the first key they
-- share instead of deadlocking, and the locks hold until the caller's
-- statement commits. The same statement returns each row's latest
-- version, so a decision runs three statements in all (the call, the
-- lock and read, the write) whether its keys had rows or not. Then every
-- key's requests are evaluated in call order, anchored first (a clock
-- behind the state), and the call's writes go out: the new states, or,
-- for a rejected call, only the anchors (a DELETE for the keys it
-- empties, only when there are any).
--
-- A request's lease is a Concurrency request's lease id, or a rate
-- request's once (0: none; ALGORITHMS.md, Once), whose entry is a row of
-- ceiling_settled: a refund is applied only while its reservation's ticket
-- stands, a forced charge only while no record does (each seeing what the
-- call's earlier settlements left), and an admitted call then deletes the
-- tickets its refunds consumed, records its forced charges, for twice
-- their period, at most a minute (60000000 µs: backend.OnceKept), and
-- writes the tickets of its admitted reservations, for twice their period
-- (backend.TicketKept).
--
-- Reply: {now, rejected (0/1), then per request: allowed (0/1),
-- remaining, reset µs, retry µs (-1 never), next µs, stamp}.
--
-- Both entry points run with the search_path Migrate set when it created
-- them (pg_catalog first, ceiling's schema, pg_temp last), so no table,
-- function or operator on the caller's search_path (nor a temporary table)
-- can stand in for ceiling's. The helpers they call touch no table and are
-- not pinned: a SET clause costs each call a GUC save and restore, and they
-- run under the entry point's path.
--
-- ceiling_decide plans its statements once per session (plan_cache_mode
-- force_generic_plan): with arrays as parameters, PostgreSQL otherwise
-- keeps choosing a custom plan, and planned the final UPDATE again at
-- every call, which cost as much as executing it.
--
-- The decision's transaction commits asynchronously (synchronous_commit
-- off, SET LOCAL: a SET clause would be undone before the commit), unless
-- Migrate's SynchronousCommit removes that line: see Migrate for the trade.
CREATE OR REPLACE FUNCTION ceiling_decide(p_now bigint, keys text[], algs int[], lims bigint[], pers bigint[],
  bursts bigint[], costs bigint[], flags int[], leases bigint[], stamps bigint[])
RETURNS bigint[] LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  -- the server's clock is read once the keys are locked, not before the
  -- call waits for them: a call that read it and then queued behind others
  -- on a hot key decided at an instant older than the states they wrote,
  -- as on a clock stepped back, and a fixed window's anchor carried the new
  -- window's count back into the old one: the new window admitted its
  -- limit again
  now bigint;
  n int := cardinality(keys);
  res bigint[];
  rejected boolean := false;
  -- per distinct key, in lock order: its name, its row as read, as
  -- anchored (what a rejected call writes) and as the call leaves it so
  -- far (alg NULL: absent), whether a row of it was stored, and whether
  -- the anchor or the call changed it
  dk text[];
  anc ceiling_state[];
  fin ceiling_state[];
  stored boolean[];
  anc_w boolean[];
  fin_w boolean[];
  ki int[]; -- each request's key, an index into dk
  c ceiling_state;
  ra record; -- an anchor's answer
  r record; -- a step's answer
  j int;
  force boolean;
  o int;
  settles boolean := false; -- the call has a rate request with a once
  ent bigint; -- a once's entry: expires, negated for a ticket (schema.sql)
  w_key text[] := '{}';
  w ceiling_state[] := '{}';
  del text[] := '{}';
  sc text; -- set_config's answer, unused
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    PERFORM ceiling_refuse_isolation();
  END IF;
  sc := set_config('synchronous_commit', 'off', true);
  IF n = 1 THEN
    RETURN ceiling_decide_one(p_now, keys[1], algs[1], lims[1], pers[1], bursts[1], costs[1], flags[1], leases[1], stamps[1]);
  END IF;
  res := array_fill(0::bigint, ARRAY[2 + 6 * n]);
  IF n = 0 THEN res[1] := coalesce(p_now, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint); RETURN res; END IF;
  WITH l AS (
    INSERT INTO ceiling_state AS t (key, alg, st, expires)
    SELECT k, -1, '{}', 0 FROM (SELECT DISTINCT unnest(keys) AS k) u ORDER BY k COLLATE "C"
    ON CONFLICT (key) DO UPDATE SET alg = t.alg
    RETURNING t.key, t.alg, t.st, t.expires)
  SELECT array_agg(l.key ORDER BY l.key),
    array_agg(ROW(l.key, CASE WHEN l.alg >= 0 THEN l.alg END, l.st, l.expires)::ceiling_state ORDER BY l.key),
    array_agg(l.alg >= 0 ORDER BY l.key), array_agg(false ORDER BY l.key)
  INTO dk, anc, stored, anc_w FROM l;
  now := coalesce(p_now, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  res[1] := now;
  ki := array_fill(0, ARRAY[n]);
  FOR i IN 1 .. n LOOP
    ki[i] := array_position(dk, keys[i]);
  END LOOP;

  -- Anchors first, on the rows as read: keys are independent, so one pass
  -- over the requests in call order anchors each key as a pass over its
  -- own requests would.
  FOR i IN 1 .. n LOOP
    j := ki[i];
    c := anc[j];
    CONTINUE WHEN c.alg IS DISTINCT FROM algs[i];
    -- most states store no time past now: skip the call for them
    CONTINUE WHEN CASE c.alg WHEN 4 THEN c.st[2] <= now WHEN 3 THEN c.st[1] <= now WHEN 2 THEN c.st[1] <= now
      WHEN 1 THEN c.st[cardinality(c.st) - 1] <= now WHEN 0 THEN c.st[2] <= now / c.st[1] ELSE false END;
    ra := ceiling_anchor(c.alg, c.st, now, pers[i]);
    IF ra.changed THEN
      anc_w[j] := true;
      IF ra.exp <= now THEN c.alg := NULL; c.st := NULL; ELSE c.st := ra.st; c.expires := ra.exp; END IF;
      anc[j] := c;
    END IF;
  END LOOP;
  fin := anc;
  fin_w := anc_w;

  FOR i IN 1 .. n LOOP
    j := ki[i];
    c := fin[j];
    force := flags[i] & 1 = 1;
    IF algs[i] <> 5 AND leases[i] <> 0 AND costs[i] <> 0 THEN
      settles := true;
      IF costs[i] < 0 OR force THEN
        -- what the call's last earlier settlement of this once left (0: none), else the table's entry
        SELECT CASE WHEN costs[k] < 0 THEN 0 ELSE now + 1 END INTO ent FROM generate_series(i - 1, 1, -1) k
        WHERE keys[k] = keys[i] AND leases[k] = leases[i] AND algs[k] <> 5 AND (costs[k] < 0 OR costs[k] > 0 AND flags[k] & 1 = 1)
        LIMIT 1;
        IF NOT FOUND THEN
          SELECT t.expires INTO ent FROM ceiling_settled t WHERE t.key = keys[i] AND t.once = leases[i];
        END IF;
        IF costs[i] < 0 AND NOT coalesce(ent < -now, false) OR costs[i] > 0 AND coalesce(ent > now, false) THEN
          costs[i] := 0; -- no ticket for a refund, a record for a charge: a peek
        END IF;
      END IF;
    END IF;
    CASE algs[i]
    WHEN 0 THEN r := ceiling_rolling(CASE WHEN c.alg = 0 THEN c.st END, now, lims[i], pers[i], costs[i], force, stamps[i]);
    WHEN 1 THEN r := ceiling_log(CASE WHEN c.alg = 1 THEN c.st END, now, lims[i], pers[i], costs[i], force, stamps[i]);
    WHEN 2 THEN r := ceiling_sliding(CASE WHEN c.alg = 2 THEN c.st END, now, lims[i], pers[i], costs[i], force, stamps[i]);
    WHEN 3 THEN r := ceiling_fixed(CASE WHEN c.alg = 3 THEN c.st END, now, lims[i], pers[i], costs[i], force, stamps[i]);
    WHEN 4 THEN r := ceiling_gcra(CASE WHEN c.alg = 4 THEN c.st END, now, lims[i], pers[i], bursts[i], costs[i], force, stamps[i]);
    WHEN 5 THEN r := ceiling_leases(CASE WHEN c.alg = 5 THEN c.st END, now, lims[i], pers[i], costs[i], force, leases[i]);
    END CASE;
    -- ALGORITHMS.md's clamps: remaining and reset at 0, next only when
    -- full, retry only when rejected, a stamp only for placed units
    o := 6 * (i - 1);
    res[3 + o : 8 + o] := ARRAY[r.ok::int, greatest(0, r.remaining), greatest(0, r.reset),
      CASE WHEN r.ok THEN 0 ELSE r.retry END, CASE WHEN r.remaining > 0 THEN 0 ELSE r.nxt END,
      CASE WHEN r.ok AND costs[i] > 0 THEN r.placed ELSE 0 END];
    IF NOT r.ok AND flags[i] & 2 = 0 THEN rejected := true; END IF;
    IF r.ok AND costs[i] <> 0 THEN
      fin_w[j] := true;
      IF r.exp <= now THEN c.alg := NULL; c.st := NULL; ELSE c.alg := algs[i]; c.st := r.st; c.expires := r.exp; END IF;
      fin[j] := c;
    END IF;
  END LOOP;

  IF rejected THEN
    -- nothing placed: every admitted request answers as a peek on the
    -- anchored state, and only the anchors are written
    res[2] := 1;
    FOR i IN 1 .. n LOOP
      o := 6 * (i - 1);
      res[8 + o] := 0;
      CONTINUE WHEN res[3 + o] = 0;
      c := anc[ki[i]];
      r := ceiling_step(CASE WHEN c.alg = algs[i] THEN c.st END,
        algs[i], now, lims[i], pers[i], bursts[i], 0, false, leases[i], 0);
      res[4 + o] := greatest(0, r.remaining);
      res[5 + o] := greatest(0, r.reset);
      res[7 + o] := CASE WHEN r.remaining > 0 THEN 0 ELSE r.nxt END;
    END LOOP;
    fin := anc;
    fin_w := anc_w;
  END IF;

  FOR j IN 1 .. cardinality(dk) LOOP
    IF fin[j].alg IS NULL AND (fin_w[j] OR NOT stored[j]) THEN
      del := del || dk[j]; -- emptied, or a row this call created for nothing
    ELSIF fin_w[j] THEN
      w_key := w_key || dk[j];
      w := w || fin[j];
    END IF;
  END LOOP;
  IF cardinality(del) > 0 THEN
    DELETE FROM ceiling_state WHERE key = ANY (del);
  END IF;
  IF cardinality(w_key) > 0 THEN
    -- keyed by = ANY, not joined with unnest: this plan stays generic (an
    -- index scan), where the join's was planned again at every call
    UPDATE ceiling_state t SET alg = (w[array_position(w_key, t.key)]).alg, st = (w[array_position(w_key, t.key)]).st,
      expires = (w[array_position(w_key, t.key)]).expires
    WHERE t.key = ANY (w_key);
  END IF;
  IF settles AND NOT rejected THEN
    DELETE FROM ceiling_settled t WHERE t.key = ANY (keys) AND t.expires BETWEEN -now AND now; -- lapsed
    DELETE FROM ceiling_settled t USING unnest(keys, algs, costs, leases) AS u(k, a, c, o)
    WHERE t.key = u.k AND t.once = u.o AND u.a <> 5 AND u.o <> 0 AND u.c < 0; -- tickets consumed
    INSERT INTO ceiling_settled (key, once, expires)
    SELECT DISTINCT ON (u.k, u.o) u.k, u.o, now + least(2 * u.p, 60000000)
    FROM unnest(keys, algs, costs, leases, pers, flags) AS u(k, a, c, o, p, f)
    WHERE u.a <> 5 AND u.o <> 0 AND u.c > 0 AND u.f & 1 = 1
    ON CONFLICT (key, once) DO UPDATE SET expires = excluded.expires; -- records
    INSERT INTO ceiling_settled (key, once, expires)
    SELECT DISTINCT ON (keys[g.x], leases[g.x]) keys[g.x], leases[g.x], -(now + 2 * pers[g.x]) FROM generate_series(1, n) AS g(x)
    WHERE algs[g.x] <> 5 AND leases[g.x] <> 0 AND costs[g.x] > 0 AND flags[g.x] & 1 = 0 AND res[3 + 6 * (g.x - 1)] = 1
    ON CONFLICT (key, once) DO UPDATE SET expires = excluded.expires; -- tickets
  END IF;
  RETURN res;
END $$;

-- ceiling_decide_one is ceiling_decide for a call of one request, the
-- most common, which the Store calls directly with scalar arguments
-- (p_now NULL: the server's clock): the same anchor, step and reply
-- without the bookkeeping of several keys, and without the extra row
-- version of the locking insert. It locks the key's row with SELECT ...
-- FOR UPDATE, so a rejection or a peek writes nothing; a key without a row
-- is decided as absent, and only an admission that leaves state inserts
-- one (ON CONFLICT DO NOTHING). If another call created the row
-- meanwhile, the decision is taken again on that row, locked by the
-- insert of ceiling_decide, whose semantics it then has. Either way a
-- decision runs three statements: the call, the lock, the write.
CREATE OR REPLACE FUNCTION ceiling_decide_one(now bigint, p_key text, p_alg int, lim bigint, p bigint,
  burst bigint, c bigint, flag int, lease bigint, stamp bigint)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
  p_now bigint := now; -- NULL: the server's clock, read once the key is locked (see ceiling_decide)
  r_alg int;
  r_st bigint[];
  r_exp bigint;
  have boolean;
  ra record;
  r record;
  a int;
  s bigint[];
  e bigint;
  anchored boolean;
  current boolean;
  force boolean := flag & 1 = 1;
  settles boolean := p_alg <> 5 AND lease <> 0 AND c <> 0; -- a rate request with a once
  reserve boolean := c > 0 AND flag & 1 = 0; -- a reservation: its ticket written if admitted
  ent bigint; -- the once's entry: expires, negated for a ticket (schema.sql)
  remaining bigint;
  nxt bigint;
  n int;
  sc text; -- set_config's answer, unused
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    PERFORM ceiling_refuse_isolation();
  END IF;
  sc := set_config('synchronous_commit', 'off', true);
  FOR pass IN 1 .. 2 LOOP
    IF pass = 1 THEN
      SELECT t.alg, t.st, t.expires INTO r_alg, r_st, r_exp FROM ceiling_state t WHERE t.key = p_key FOR UPDATE;
      have := FOUND;
    ELSE
      INSERT INTO ceiling_state AS t (key, alg, st, expires) VALUES (p_key, -1, '{}', 0)
      ON CONFLICT (key) DO UPDATE SET alg = t.alg
      RETURNING t.alg, t.st, t.expires INTO r_alg, r_st, r_exp;
      have := true;
    END IF;
    now := coalesce(p_now, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
    a := CASE WHEN r_alg = p_alg THEN p_alg END; -- another algorithm's state: absent
    s := r_st;
    anchored := false;
    -- most states store no time past now: no anchor to compute for them
    current := CASE a WHEN 4 THEN s[2] <= now WHEN 3 THEN s[1] <= now WHEN 2 THEN s[1] <= now
      WHEN 1 THEN s[cardinality(s) - 1] <= now WHEN 0 THEN s[2] <= now / s[1] ELSE false END;
    IF a IS NOT NULL AND current IS NOT TRUE THEN
      ra := ceiling_anchor(a, s, now, p);
      IF ra.changed THEN
        anchored := true;
        IF ra.exp <= now THEN a := NULL; ELSE s := ra.st; e := ra.exp; END IF;
      END IF;
    END IF;
    IF a IS NULL THEN s := NULL; END IF;
    IF settles AND NOT reserve THEN -- checked under the row's lock, again on the second pass
      SELECT t.expires INTO ent FROM ceiling_settled t WHERE t.key = p_key AND t.once = lease;
      IF c < 0 AND NOT coalesce(ent < -now, false) OR c > 0 AND coalesce(ent > now, false) THEN
        c := 0; settles := false; -- no ticket for a refund, a record for a charge: a peek
      END IF;
    END IF;
    CASE p_alg
    WHEN 0 THEN r := ceiling_rolling(s, now, lim, p, c, force, stamp);
    WHEN 1 THEN r := ceiling_log(s, now, lim, p, c, force, stamp);
    WHEN 2 THEN r := ceiling_sliding(s, now, lim, p, c, force, stamp);
    WHEN 3 THEN r := ceiling_fixed(s, now, lim, p, c, force, stamp);
    WHEN 4 THEN r := ceiling_gcra(s, now, lim, p, burst, c, force, stamp);
    WHEN 5 THEN r := ceiling_leases(s, now, lim, p, c, force, lease);
    END CASE;
    IF have THEN
      IF r.ok AND c <> 0 THEN
        IF r.exp <= now THEN
          DELETE FROM ceiling_state t WHERE t.key = p_key;
        ELSE
          UPDATE ceiling_state t SET alg = p_alg, st = r.st, expires = r.exp WHERE t.key = p_key;
        END IF;
      ELSIF anchored AND a IS NOT NULL THEN
        UPDATE ceiling_state t SET st = s, expires = e WHERE t.key = p_key;
      ELSIF anchored OR r_alg < 0 THEN
        DELETE FROM ceiling_state t WHERE t.key = p_key; -- emptied, or created for nothing
      END IF;
      EXIT;
    END IF;
    EXIT WHEN NOT r.ok OR c = 0 OR r.exp <= now; -- nothing to store
    INSERT INTO ceiling_state (key, alg, st, expires) VALUES (p_key, p_alg, r.st, r.exp) ON CONFLICT (key) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    EXIT WHEN n = 1;
  END LOOP;
  IF settles AND r.ok THEN
    DELETE FROM ceiling_settled t WHERE t.key = p_key AND t.expires BETWEEN -now AND now; -- lapsed
    IF c < 0 THEN
      DELETE FROM ceiling_settled t WHERE t.key = p_key AND t.once = lease; -- the ticket, consumed
    ELSE
      INSERT INTO ceiling_settled (key, once, expires)
      VALUES (p_key, lease, CASE WHEN reserve THEN -(now + 2 * p) ELSE now + least(2 * p, 60000000) END)
      ON CONFLICT (key, once) DO UPDATE SET expires = excluded.expires;
    END IF;
  END IF;
  remaining := greatest(0, r.remaining);
  nxt := CASE WHEN remaining > 0 THEN 0 ELSE r.nxt END;
  RETURN ARRAY[now, CASE WHEN NOT r.ok AND flag & 2 = 0 THEN 1 ELSE 0 END, r.ok::int, remaining, greatest(0, r.reset),
    CASE WHEN r.ok THEN 0 ELSE r.retry END, nxt, CASE WHEN r.ok AND c > 0 THEN r.placed ELSE 0 END];
END $$;

-- ceiling_step decides one request on its key's state (NULL: absent or
-- another algorithm's).
CREATE OR REPLACE FUNCTION ceiling_step(s bigint[], alg int, now bigint, lim bigint, p bigint, burst bigint, c bigint,
  force boolean, lease bigint, stamp bigint,
  OUT ok boolean, OUT remaining bigint, OUT reset bigint, OUT retry bigint, OUT nxt bigint, OUT placed bigint, OUT st bigint[], OUT exp bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  CASE alg
  WHEN 0 THEN SELECT * INTO ok, remaining, reset, retry, nxt, placed, st, exp FROM ceiling_rolling(s, now, lim, p, c, force, stamp);
  WHEN 1 THEN SELECT * INTO ok, remaining, reset, retry, nxt, placed, st, exp FROM ceiling_log(s, now, lim, p, c, force, stamp);
  WHEN 2 THEN SELECT * INTO ok, remaining, reset, retry, nxt, placed, st, exp FROM ceiling_sliding(s, now, lim, p, c, force, stamp);
  WHEN 3 THEN SELECT * INTO ok, remaining, reset, retry, nxt, placed, st, exp FROM ceiling_fixed(s, now, lim, p, c, force, stamp);
  WHEN 4 THEN SELECT * INTO ok, remaining, reset, retry, nxt, placed, st, exp FROM ceiling_gcra(s, now, lim, p, burst, c, force, stamp);
  WHEN 5 THEN SELECT * INTO ok, remaining, reset, retry, nxt, placed, st, exp FROM ceiling_leases(s, now, lim, p, c, force, lease);
  END CASE;
END $$;

-- ceiling_refuse_isolation refuses a decision in a transaction above READ
-- COMMITTED (a session default of REPEATABLE READ or SERIALIZABLE): there
-- concurrent decisions on one key abort with serialization failures
-- instead of queueing, and each abort would reach the limiter's fail mode,
-- a limit weaker than configured. Refused, every call fails loudly and
-- Limiter.Check refuses the configuration at start.
CREATE OR REPLACE FUNCTION ceiling_refuse_isolation() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'ceiling: decisions need READ COMMITTED, and this transaction is %', current_setting('transaction_isolation')
    USING ERRCODE = '0A000', HINT = 'set default_transaction_isolation to ''read committed'' for the role or the pool ceiling uses';
END $$;

-- ceiling_reset and ceiling_sweep are the Store's Reset and its janitor's
-- bounded delete, pinned to ceiling's schema as the decisions are: as
-- plain statements they named ceiling_state through the session's
-- search_path, so a temporary table of that name (searched first) or one
-- in a schema earlier on the path took the delete, and Reset reported
-- success while the key kept its count. Each returns how many rows it
-- deleted. ceiling_sweep deletes at most p_batch rows whose state was back
-- to full at p_now (NULL: the server's clock), skipping rows a decision
-- holds, and at most p_batch tickets and records expired by then; it
-- returns how many states it deleted. ceiling_reset locks its rows in the
-- order a decision does (by key, in the C collation) before it deletes
-- them: a delete walks rows in whatever order its plan reads them, and a
-- decision holding one of the keys would wait on the reset as the reset
-- waits on it.
CREATE OR REPLACE FUNCTION ceiling_reset(p_keys text[]) RETURNS bigint
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
  WITH l AS (SELECT key FROM ceiling_state WHERE key = ANY (p_keys) ORDER BY key COLLATE "C" FOR UPDATE),
  d AS (DELETE FROM ceiling_state t USING l WHERE t.key = l.key RETURNING 1)
  SELECT count(*) FROM d
$$;

CREATE OR REPLACE FUNCTION ceiling_sweep(p_now bigint, p_batch bigint) RETURNS bigint
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
  WITH settled AS (DELETE FROM ceiling_settled WHERE (key, once) IN (
    SELECT key, once FROM ceiling_settled
    WHERE expires BETWEEN -coalesce(p_now, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
      AND coalesce(p_now, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
    ORDER BY expires LIMIT p_batch FOR UPDATE SKIP LOCKED)),
  d AS (DELETE FROM ceiling_state WHERE key IN (
    SELECT key FROM ceiling_state
    WHERE expires <= coalesce(p_now, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint) AND alg >= 0
    ORDER BY expires LIMIT p_batch FOR UPDATE SKIP LOCKED) RETURNING 1)
  SELECT count(*) FROM d
$$;
