#!/usr/bin/env bash
# A first tour of the gateway with curl: discover the domain, make a pipe, publish
# to it through the default feed, receive and acknowledge, then a topic feed with a
# join, and the same round trip in JSON. Every step prints the request, the status
# and the body; the script stops with a non-zero exit at the first step that fails.
#
# Start a gateway first (scripts/serve), then:   bash examples/walkthrough.sh
# Another gateway:   RESTMS_URL=http://127.0.0.1:18181 bash examples/walkthrough.sh
# With an access token (docs/AUTH.md), not as the loopback guest:
#   RESTMS_TOKEN=<access_token> bash examples/walkthrough.sh
# The feed walkthrough-news belongs to the principal that made it first; a run as
# another principal gets 403 when it tries to delete it (step 6).
# Needs bash, curl, grep, sed and python3 (for the JSON step). Safe to run again.
set -euo pipefail

BASE=${RESTMS_URL:-http://127.0.0.1:8080}
BASE=${BASE%/}
XML=application/restms+xml
JSON=application/restms+json
NS=http://www.restms.org/schema/restms
FEED_NAME=walkthrough-news

AUTH=()
if [ -n "${RESTMS_TOKEN:-}" ]; then
  AUTH=(-H "Authorization: Bearer $RESTMS_TOKEN")
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

step() { printf '\n== %s\n' "$*"; }
fail() {
  printf '\nwalkthrough: FAILED: %s\n' "$*" >&2
  exit 1
}

# call EXPECTED METHOD URL [curl options...]
# One request: prints it with its status and body, fails unless the status is one of
# EXPECTED (space-separated). The body is kept in $tmp/body, the headers in $tmp/headers.
call() {
  local expected=$1 method=$2 url=$3 status
  shift 3
  status=$(curl -sS --max-time 30 -X "$method" -o "$tmp/body" -D "$tmp/headers" \
    -w '%{http_code}' ${AUTH[@]+"${AUTH[@]}"} "$@" "$url") ||
    fail "$method $url: no answer (is a gateway running at $BASE?)"
  printf '%s %s -> %s\n' "$method" "$url" "$status"
  if [ -s "$tmp/body" ]; then
    sed 's/^/    /' "$tmp/body"
    printf '\n'
  fi
  case " $expected " in
    *" $status "*) ;;
    *) fail "$method $url answered $status, expected $expected" ;;
  esac
}

# header NAME: the value of a response header of the last call.
header() { tr -d '\r' <"$tmp/headers" | { grep -i "^$1:" || true; } | tail -n1 | sed 's/^[^:]*: *//'; }

# xml_attr TAG FILTER NAME: attribute NAME of the first <TAG ...> in the last body whose
# text contains FILTER ("" matches any).
xml_attr() {
  { grep -o "<$1 [^>]*>" "$tmp/body" || true; } | { grep -F -- "$2" || true; } | head -n1 |
    { grep -o " $3=\"[^\"]*\"" || true; } | sed 's/^[^"]*"//; s/"$//'
}

# expect TEXT WHAT: fail unless the last body contains TEXT.
expect() { grep -qF -- "$1" "$tmp/body" || fail "$2: '$1' not in the reply"; }

# need VALUE WHAT: fail when VALUE is empty.
need() { [ -n "$1" ] || fail "could not find $2 in the reply"; }

# ---------------------------------------------------------------------------
if [ ${#AUTH[@]} -gt 0 ]; then
  echo "Every request carries RESTMS_TOKEN as a bearer token."
else
  echo "No RESTMS_TOKEN: the requests act as the loopback guest."
fi

step "1. Discover the default domain: profiles and public feeds"
call 200 GET "$BASE/restms/domain/default" -H "Accept: $XML"
expect 'name="3/Defaults"' "domain document"
DEFAULT_FEED=$(xml_attr feed 'name="default"' href)
need "$DEFAULT_FEED" "the default feed's href"
echo "default feed: $DEFAULT_FEED"

step "2. Create a pipe (POST a <pipe/> to the domain)"
call 201 POST "$BASE/restms/domain/default" -H "Content-Type: $XML" \
  --data "<restms xmlns=\"$NS\"><pipe title=\"walkthrough\"/></restms>"
PIPE=$(header Location)
PIPE_NAME=$(xml_attr pipe '' name)
ASYNCLET=$(xml_attr message 'async="1"' href)
need "$PIPE" "Location"
need "$PIPE_NAME" "the pipe name"
need "$ASYNCLET" "the asynclet href"
echo "pipe: $PIPE"
echo "pipe name (its address on the default feed): $PIPE_NAME"
echo "asynclet (where the next message will be): $ASYNCLET"

step "3. Publish to the default feed, addressed to the pipe"
call 200 POST "$DEFAULT_FEED" -H "Content-Type: $XML" --data "<restms xmlns=\"$NS\">\
<message address=\"$PIPE_NAME\" message_id=\"hello-$PIPE_NAME\"><header name=\"lang\" value=\"en\"/>\
<content type=\"text/plain\" encoding=\"plain\">Hello, RestMS</content></message></restms>"
expect 'count="1"' "publish reply"

step "4. GET the asynclet: it now holds the message (it would wait if the pipe were empty)"
call 200 GET "$ASYNCLET" -H "Accept: $XML"
expect 'Hello, RestMS' "message document"

step "5. DELETE the message to acknowledge it (this also removes every older message)"
call 200 DELETE "$ASYNCLET"
call 404 GET "$ASYNCLET"
call 200 GET "$PIPE" -H "Accept: $XML"
echo "new asynclet: $(xml_attr message 'async="1"' href)"

step "6. A topic feed and a join"
# Start clean in case an earlier run stopped half-way: DELETE is idempotent (200 even
# when the feed does not exist).
call 200 DELETE "$BASE/restms/feed/$FEED_NAME"
call 201 POST "$BASE/restms/domain/default" -H "Content-Type: $XML" \
  --data "<restms xmlns=\"$NS\"><feed name=\"$FEED_NAME\" type=\"topic\" title=\"Walkthrough news\"/></restms>"
FEED=$(header Location)
need "$FEED" "Location"
echo "Creating a public feed again is idempotent: 200 and the same Location."
call 200 POST "$BASE/restms/domain/default" -H "Content-Type: $XML" \
  --data "<restms xmlns=\"$NS\"><feed name=\"$FEED_NAME\" type=\"topic\"/></restms>"
[ "$(header Location)" = "$FEED" ] || fail "the second create gave another Location"
call 201 POST "$PIPE" -H "Content-Type: $XML" \
  --data "<restms xmlns=\"$NS\"><join address=\"weather.#\" feed=\"$FEED\"/></restms>"
JOIN=$(header Location)
need "$JOIN" "the join's Location"
call 200 POST "$FEED" -H "Content-Type: $XML" --data "<restms xmlns=\"$NS\">\
<message address=\"weather.eu.rain\"><content type=\"text/plain\">Rain over Europe</content></message>\
<message address=\"sports.football\"><content type=\"text/plain\">Not for this pipe</content></message>\
</restms>"
expect '<message count="1"/><message count="0"/>' "publish reply (one count per message)"
call 200 GET "$PIPE" -H "Accept: $XML"
MESSAGE=$(xml_attr message 'address="weather.eu.rain"' href)
need "$MESSAGE" "the listed message"
call 200 GET "$MESSAGE" -H "Accept: $XML"
expect 'Rain over Europe' "message document"
call 200 DELETE "$MESSAGE"

step "7. The same round trip in JSON"
call 201 POST "$BASE/restms/domain/default" -H "Content-Type: $JSON" -H "Accept: $JSON" \
  --data '{"restms": {"pipe": [{"title": "walkthrough-json"}]}}'
JSON_PIPE=$(header Location)
read -r JSON_NAME JSON_ASYNCLET < <(python3 -c '
import json, sys
pipe = json.load(open(sys.argv[1]))["restms"]["pipe"][0]
asynclet = [m["href"] for m in pipe["message"] if m.get("async") == "1"][0]
print(pipe["name"], asynclet)' "$tmp/body") || fail "could not read the JSON pipe document"
need "$JSON_PIPE" "Location"
call 200 POST "$DEFAULT_FEED" -H "Content-Type: $JSON" -H "Accept: $JSON" \
  --data "{\"restms\": {\"message\": [{\"address\": \"$JSON_NAME\",
           \"content\": [{\"type\": \"text/plain\", \"encoding\": \"plain\", \"value\": \"Hello in JSON\"}]}]}}"
expect '"count":"1"' "publish reply"
call 200 GET "$JSON_ASYNCLET" -H "Accept: $JSON"
python3 -c '
import json, sys
message = json.load(open(sys.argv[1]))["restms"]["message"][0]
print("content value:", message["content"][0]["value"])
sys.exit(message["content"][0]["value"] != "Hello in JSON")' "$tmp/body" ||
  fail "the JSON message does not carry the published content"
call 200 DELETE "$JSON_ASYNCLET"

step "8. Clean up: delete the pipes and the feed (a second DELETE would also give 200)"
call 200 DELETE "$JSON_PIPE"
call 200 DELETE "$PIPE"
call 200 DELETE "$FEED"
call 404 GET "$PIPE"

printf '\nwalkthrough: all steps passed against %s\n' "$BASE"
