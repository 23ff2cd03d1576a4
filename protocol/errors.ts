/**
 * The protocol layer's one error type. Every decoding or validation failure of wire data throws a
 * `ProtocolError` whose `code` says what kind of failure it was; the server turns it into an
 * `{"id", "error"}` answer, an HTTP 4xx body, or a policy-server text frame. Messages quote the
 * real values ("prompt is 1400 bytes; the limit is 1024").
 */
export type ProtocolErrorCode =
  | 'bad_msgpack' // bytes that are not one msgpack value
  | 'bad_ndarray' // an ndarray map with missing/ill-typed fields
  | 'unsupported_dtype' // O, V, c dtypes or an unknown dtype string
  | 'shape_mismatch' // shape product x itemsize != data length, or a wrong shape for the op
  | 'bad_frame' // truncated or corrupt image bytes
  | 'unknown_codec' // a codec name we do not know
  | 'too_large' // a size limit (pixels, bytes, batch) was exceeded
  | 'dictionary_mismatch' // a zstd frame made with another dictionary
  | 'bad_zstd' // a truncated or corrupt zstd frame
  | 'bad_request'; // anything else wrong with a message's structure

export class ProtocolError extends Error {
  readonly code: ProtocolErrorCode;
  constructor(code: ProtocolErrorCode, message: string) {
    super(message);
    this.name = 'ProtocolError';
    this.code = code;
  }
}

/**
 * What the clients (protocol/client.ts, protocol/policy-client.ts) throw for an error answer of an
 * op, or an HTTP error: `code` is the server's code (or the HTTP status), `requestId` the op's id.
 * Here rather than in either client so that neither imports the other.
 */
export class VelaError extends Error {
  constructor(readonly code: string, message: string, readonly requestId?: number) {
    super(message);
    this.name = 'VelaError';
  }
}
