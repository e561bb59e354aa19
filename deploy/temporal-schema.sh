#!/bin/sh
# Temporal's two databases on the compose PostgreSQL, created and brought to the schema of the
# admin-tools release (run by the temporal-schema job of docker-compose.yaml before the server
# starts; every step may run again on the next `docker compose up`).
set -eu
sql() { temporal-sql-tool --plugin postgres12 --ep postgresql -u temporal -p 5432 "$@"; }
schema=/etc/temporal/schema/postgresql/v12
for db in temporal temporal_visibility; do
    sql --db "$db" create || echo "database $db exists"
done
sql --db temporal setup-schema -v 0.0
sql --db temporal update-schema -d "$schema/temporal/versioned"
sql --db temporal_visibility setup-schema -v 0.0
sql --db temporal_visibility update-schema -d "$schema/visibility/versioned"
