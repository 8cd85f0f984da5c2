-- Workers keep a copy of the retry policies to decide at once whether a failure is retried
-- in place; this tells them when it goes stale, however the policies were changed (through
-- the dashboard, the API, or by hand in SQL).
CREATE FUNCTION rebound_policies_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('rebound_policies', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER retry_policies_notify
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON retry_policies
    FOR EACH STATEMENT EXECUTE FUNCTION rebound_policies_changed();
