-- The table of ceiling's Postgres backend: one row per key with state.
-- key is what ceiling passes ({digest}:rule, a fixed-length HMAC digest of
-- the identifier: no raw identifier is stored), with the store's prefix;
-- alg and st are the algorithm and its state (algorithms.sql); expires is
-- when the state is back to full, in µs since the Unix epoch on the
-- decisions' clock, which the janitor's bounded delete goes by.
CREATE TABLE IF NOT EXISTS ceiling_state (
  key text COLLATE "C" PRIMARY KEY,
  alg smallint NOT NULL,
  st bigint[] NOT NULL,
  expires bigint NOT NULL
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS ceiling_state_expires ON ceiling_state (expires);
-- ceiling_settled holds the entry of a once (backend.Request.Once) on a
-- key: a forced charge's record until expires (µs, the decisions' clock;
-- twice the rule's period, at most a minute: backend.OnceKept), or a
-- reservation's ticket until -expires (twice the period:
-- backend.TicketKept), which a refund consumes. An entry has lapsed once
-- expires is between -now and now. The decision that writes one on a key
-- deletes the key's lapsed entries, the janitor those of idle keys.
CREATE TABLE IF NOT EXISTS ceiling_settled (
  key text COLLATE "C" NOT NULL,
  once bigint NOT NULL,
  expires bigint NOT NULL,
  PRIMARY KEY (key, once)
);
CREATE INDEX IF NOT EXISTS ceiling_settled_expires ON ceiling_settled (expires);
