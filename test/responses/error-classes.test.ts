// The three error classes whose `code` carries a wire value (the OpenAI error
// code of a Responses or Batches answer, the socket's errno name) are
// SwitchyardErrors with a stable SWY_ERR_* `swyCode`, and keep `code` as their
// readers use it (docs/errors.md); every other class's swyCode is its code.
import t from 'tap';
import { ConfigError, SwitchyardError } from '../../src/errors.js';
import { ResponsesError } from '../../src/responses/request.js';
import { BatchApiError } from '../../src/batch/store.js';
import { UpstreamSocketError } from '../../src/proxy/upstream.js';
import { errorBody } from '../../src/proxy/error-shape.js';

t.test('ResponsesError: a SwitchyardError; code stays the OpenAI code (undefined: the status default)', (t) => {
  const a = new ResponsesError(400, "unknown parameter 'x'", 'x');
  t.ok(a instanceof SwitchyardError && a instanceof Error);
  t.equal(a.swyCode, 'SWY_ERR_RESPONSES_REQUEST');
  t.equal(a.code, undefined, 'no code: the status default applies');
  t.equal(a.name, 'ResponsesError');
  t.same([a.status, a.message, a.param], [400, "unknown parameter 'x'", 'x']);
  const b = new ResponsesError(404, 'Response with id resp_1 not found.', 'previous_response_id', 'previous_response_not_found');
  t.equal(b.code, 'previous_response_not_found');
  t.equal(b.swyCode, 'SWY_ERR_RESPONSES_REQUEST');
  t.match(JSON.parse(errorBody(b.status, b.message, b.param, b.code)), { error: { code: 'previous_response_not_found', param: 'previous_response_id' } });
  t.end();
});

t.test('BatchApiError: a SwitchyardError; code stays the OpenAI code (null: the status default)', (t) => {
  const a = new BatchApiError(404, 'No such File object: file-x', 'file_id');
  t.ok(a instanceof SwitchyardError);
  t.equal(a.code, null);
  t.equal(a.swyCode, 'SWY_ERR_BATCH_API');
  t.equal(a.name, 'BatchApiError');
  const b = new BatchApiError(400, 'too many lines', 'input_file_id', 'invalid_file');
  t.equal(b.code, 'invalid_file');
  t.equal(b.swyCode, 'SWY_ERR_BATCH_API');
  t.end();
});

t.test('UpstreamSocketError: a SwitchyardError; code stays the errno name', (t) => {
  const e = new UpstreamSocketError('connect ECONNREFUSED', 'ECONNREFUSED');
  t.ok(e instanceof SwitchyardError);
  t.equal(e.code, 'ECONNREFUSED');
  t.equal(e.swyCode, 'SWY_ERR_UPSTREAM_SOCKET');
  t.equal(e.name, 'UpstreamSocketError');
  t.end();
});

t.test('every other class: swyCode is code', (t) => {
  const c = new ConfigError([{ path: 'a', message: 'b' }]);
  t.equal(c.swyCode, 'SWY_ERR_CONFIG');
  t.equal(c.code, 'SWY_ERR_CONFIG');
  t.equal(new SwitchyardError('x').swyCode, 'SWY_ERR_GENERIC');
  t.end();
});
