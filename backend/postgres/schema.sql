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
