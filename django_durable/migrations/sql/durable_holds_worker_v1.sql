-- durable_holds_worker_v1: the rule of a run that holds a worker (models.HOLDS_WORKER:
-- running or compensating, with a lease), what every concurrency limit counts and the
-- slot indexes' condition; written once for durable_claim_v5. An SQL function
-- PostgreSQL inlines, so the claim's statements still match those partial indexes.
-- Created by 0.3.0's migration (0001_0_3_initial).
CREATE OR REPLACE FUNCTION durable_holds_worker_v1(p_status varchar, p_lease_expires_at timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $holds$ SELECT p_status IN ('running', 'compensating') AND p_lease_expires_at IS NOT NULL $holds$;
