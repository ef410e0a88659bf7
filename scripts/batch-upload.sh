#!/usr/bin/env bash
# Uploads a JSONL file of documents as one jobledger batch, watches it and downloads
# the results. Each input line is {"id": "...", "text": "..."}; each becomes an item
# whose customId is the id, asking the model to summarise the text.
#
#   JOBLEDGER_URL=http://127.0.0.1:8080 JOBLEDGER_KEY=jl_... \
#     scripts/batch-upload.sh documents.jsonl results.jsonl [model]
#
# Needs curl and jq. Safe to run again after a failure: the batch is found again by its
# idempotency key (from the file's checksum) and chunks already sent add nothing.
set -euo pipefail
input=${1:?usage: batch-upload.sh INPUT.jsonl OUTPUT.jsonl [MODEL]}
output=${2:?usage: batch-upload.sh INPUT.jsonl OUTPUT.jsonl [MODEL]}
model=${3:-gpt-4o-mini}
url=${JOBLEDGER_URL:-http://127.0.0.1:8080}
key=${JOBLEDGER_KEY:?set JOBLEDGER_KEY to a tenant API key}

# One GraphQL call: the request body on stdin, `data` on stdout; errors end the script.
gql() {
  local answer
  answer=$(curl -sS --fail-with-body "$url/graphql" -H 'content-type: application/json' \
    -H "authorization: Bearer $key" --data-binary @-)
  if jq -e '.errors' <<<"$answer" >/dev/null; then
    echo "batch-upload: $(jq -c '.errors' <<<"$answer")" >&2
    exit 1
  fi
  jq -c '.data' <<<"$answer"
}

digest=$(sha256sum "$input" | cut -c1-32)
created=$(jq -n --arg key "upload-$digest" --arg name "$(basename "$input")" --arg model "$model" '{
  query: "mutation($i: CreateBatchInput!) { createBatch(input: $i) { replayed batch { id status } } }",
  variables: {i: {idempotencyKey: $key, name: $name, model: $model, maxOutputTokens: 200}}
}' | gql)
batch=$(jq -r '.createBatch.batch.id' <<<"$created")
echo "batch $batch"

# Chunks of 1,000 lines, the most one addBatchItems call takes; a batch closed by an
# earlier run takes no more and is only watched.
if [ "$(jq -r '.createBatch.batch.status' <<<"$created")" = OPEN ]; then
  chunks=$(mktemp -d)
  trap 'rm -rf "$chunks"' EXIT
  split -l 1000 "$input" "$chunks/chunk-"
  for chunk in "$chunks"/chunk-*; do
    jq -s -c --arg batch "$batch" '{
      query: "mutation($b: UUID!, $items: [BatchItemInput!]!) { addBatchItems(batchId: $b, items: $items) { added replayed batch { itemCount } } }",
      variables: {b: $batch, items: map({customId: .id,
        messages: [{role: "user", content: ("Summarise in one sentence:\n\n" + .text)}]})}
    }' "$chunk" | gql | jq -r '.addBatchItems | "added \(.added), replayed \(.replayed), \(.batch.itemCount) items in the batch"'
  done

  jq -n --arg id "$batch" '{query: "mutation($id: UUID!) { closeBatch(id: $id) { status } }", variables: {id: $id}}' \
    | gql >/dev/null
fi

# Progress until FINISHED (a client could subscribe to batchUpdates instead).
while :; do
  state=$(jq -n --arg id "$batch" '{
    query: "query($id: UUID!) { batch(id: $id) { status itemCount counts { queued running succeeded failed cancelled } customerCharge reserved } }",
    variables: {id: $id}}' | gql)
  jq -r '.batch | "\(.status): \(.counts.succeeded + .counts.failed + .counts.cancelled)/\(.itemCount) finished (\(.counts.queued) queued, \(.counts.running) running, \(.counts.failed) failed), charged \(.customerCharge) cr, \(.reserved) cr still held"' <<<"$state"
  [ "$(jq -r '.batch.status' <<<"$state")" = FINISHED ] && break
  sleep "${JOBLEDGER_POLL_SECONDS:-2}"
done

curl -sS --fail "$url/batches/$batch/results" -H "authorization: Bearer $key" -o "$output"
echo "results: $output ($(wc -l <"$output") lines, $(jq -s 'map(select(.status == "SUCCEEDED")) | length' "$output") succeeded)"
