#!/usr/bin/env bash
# scripts/try-gitea.sh: a throwaway Gitea on 127.0.0.1 to try local mode against.
#
#   scripts/try-gitea.sh up     build Gitea once (scripts/peers/gitea.sh), start it, create an
#                               admin, a repository with a workflow, and print the URL and a
#                               runner registration token
#   scripts/try-gitea.sh down   stop it (the process this script started, by its PID file)
#
# Data lives in ${GDR_TRY_DIR:-$HOME/.cache/gitea-dynamic-runner/try}; port ${GDR_TRY_PORT:-3000}.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${GDR_TRY_DIR:-$HOME/.cache/gitea-dynamic-runner/try}
PORT=${GDR_TRY_PORT:-3000}
URL="http://127.0.0.1:$PORT/"
CONF=$DIR/app.ini
export GITEA_I_AM_BEING_UNSAFE_RUNNING_AS_ROOT=true

down() {
  if [ -f "$DIR/gitea.pid" ] && kill -0 "$(cat "$DIR/gitea.pid")" 2>/dev/null; then
    kill "$(cat "$DIR/gitea.pid")"
    echo "stopped Gitea (pid $(cat "$DIR/gitea.pid"))"
  fi
  rm -f "$DIR/gitea.pid"
}

up() {
  bin=$(./scripts/peers/gitea.sh build)/gitea
  static=$(dirname "$bin")/static
  mkdir -p "$DIR/data" "$DIR/log"
  if [ ! -f "$CONF" ]; then
    cat >"$CONF" <<INI
APP_NAME = gitea-dynamic-runner try
RUN_MODE = prod
WORK_PATH = $DIR
I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true
[server]
HTTP_ADDR = 127.0.0.1
HTTP_PORT = $PORT
ROOT_URL = $URL
DISABLE_SSH = true
APP_DATA_PATH = $DIR/data
STATIC_ROOT_PATH = $static
[database]
DB_TYPE = sqlite3
PATH = $DIR/data/gitea.db
[repository]
ROOT = $DIR/data/repos
DEFAULT_BRANCH = main
[security]
INSTALL_LOCK = true
SECRET_KEY = $("$bin" generate secret SECRET_KEY 2>/dev/null)
INTERNAL_TOKEN = $("$bin" generate secret INTERNAL_TOKEN 2>/dev/null)
ALLOWED_HOST_LIST = loopback
[service]
DISABLE_REGISTRATION = true
[actions]
ENABLED = true
DEFAULT_ACTIONS_URL = self
[log]
MODE = file
ROOT_PATH = $DIR/log
INI
  fi
  if ! { [ -f "$DIR/gitea.pid" ] && kill -0 "$(cat "$DIR/gitea.pid")" 2>/dev/null; }; then
    (cd "$DIR" && exec nohup "$bin" web --config "$CONF" --work-path "$DIR" --pid "$DIR/gitea.pid") \
      >"$DIR/log/web.out" 2>&1 </dev/null &
    for _ in $(seq 1 100); do curl -fsS -m 2 "${URL}api/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  curl -fsS -m 2 "${URL}api/healthz" >/dev/null || { tail -20 "$DIR/log/web.out"; exit 1; }
  if [ ! -f "$DIR/admin.token" ]; then
    "$bin" --config "$CONF" --work-path "$DIR" admin user create --username gdr --password 'gdr-Passw0rd!' \
      --email gdr@example.invalid --admin --must-change-password=false --access-token \
      --access-token-name try --access-token-scopes all 2>/dev/null |
      awk '/Access token was successfully created/{print $NF}' >"$DIR/admin.token"
  fi
  token=$(cat "$DIR/admin.token")
  api() { curl -fsS -H "Authorization: token $token" -H 'Content-Type: application/json' "$@"; }
  if ! api "${URL}api/v1/repos/gdr/demo" >/dev/null 2>&1; then
    api -X POST "${URL}api/v1/user/repos" -d '{"name":"demo","auto_init":true,"default_branch":"main"}' >/dev/null
    wf=$(printf 'name: ci\non: [push]\njobs:\n  hello:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo hello from gitea-dynamic-runner\n' | base64 | tr -d '\n')
    api -X POST "${URL}api/v1/repos/gdr/demo/contents/.gitea/workflows/ci.yml" \
      -d "{\"content\":\"$wf\",\"message\":\"add a workflow\",\"branch\":\"main\"}" >/dev/null
  fi
  reg=$(api -X POST "${URL}api/v1/admin/actions/runners/registration-token" | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
  echo "Gitea:              $URL (user gdr, password gdr-Passw0rd!)"
  echo "Repository:         ${URL}gdr/demo (a push runs its workflow)"
  echo "Registration token: $reg"
  echo
  echo "Run:  GDR_REGISTRATION_TOKEN=$reg make run GITEA_URL=$URL"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
