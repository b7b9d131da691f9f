#!/bin/sh
# Run once by the postgres image when it creates the database (docker-compose.yml mounts it
# into /docker-entrypoint-initdb.d). Two roles, neither a superuser:
#   semjobs_owner  owns the database and its schema: `semjobs db upgrade` (migrations) only;
#   semjobs_app    the service (workers, CLI, Flower): reads and writes rows, creates nothing.
# A superuser can run programs on the server (COPY ... TO PROGRAM); the service never needs to.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v owner_pw="$SEMJOBS_OWNER_DB_PASSWORD" -v app_pw="$SEMJOBS_APP_DB_PASSWORD" <<'SQL'
CREATE ROLE semjobs_owner LOGIN PASSWORD :'owner_pw';
CREATE ROLE semjobs_app LOGIN PASSWORD :'app_pw';
ALTER DATABASE semjobs OWNER TO semjobs_owner;
REVOKE ALL ON DATABASE semjobs FROM PUBLIC;
GRANT CONNECT ON DATABASE semjobs TO semjobs_app;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
ALTER SCHEMA public OWNER TO semjobs_owner;
GRANT USAGE ON SCHEMA public TO semjobs_app;
-- what the migrations create from now on, the service may use (not alter)
ALTER DEFAULT PRIVILEGES FOR ROLE semjobs_owner IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO semjobs_app;
ALTER DEFAULT PRIVILEGES FOR ROLE semjobs_owner IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO semjobs_app;
SQL
