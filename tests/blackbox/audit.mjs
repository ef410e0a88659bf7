// Runs the graphql-http audit suite (the GraphQL-over-HTTP specification's own
// checks) against a running jobledger, as any client would reach it:
//
//   node tests/blackbox/audit.mjs http://127.0.0.1:8080/graphql
//
// Prints one line per audit and exits 1 when any MUST audit fails (SHOULD and MAY
// findings are printed, not fatal), 2 when it could not run.
import { serverAudits } from 'graphql-http';

const url = process.argv[2] ?? process.env.JOBLEDGER_GRAPHQL_URL;
if (!url) {
  console.error('usage: node audit.mjs <GraphQL URL, e.g. http://127.0.0.1:8080/graphql>');
  process.exit(2);
}

let mustFailures = 0;
let findings = 0;
// One audit at a time: they are requests from one client, and the server limits how
// many one client may have in flight.
for (const audit of serverAudits({ url })) {
  const result = await audit.fn();
  if (result.status === 'ok') {
    console.log(`ok      ${audit.id} ${audit.name}`);
    continue;
  }
  const must = audit.name.startsWith('MUST') || result.status === 'error';
  if (must) {
    mustFailures += 1;
  } else {
    findings += 1;
  }
  const body = await result.response.text().catch((error) => `(body unreadable: ${error})`);
  console.log(
    `${must ? 'FAIL' : result.status.padEnd(6)}  ${audit.id} ${audit.name}: ${result.reason}\n` +
      `        status ${result.response.status}, body ${body.slice(0, 300)}`,
  );
}
console.log(`${mustFailures} MUST audit(s) failed; ${findings} SHOULD/MAY finding(s)`);
process.exit(mustFailures === 0 ? 0 : 1);
