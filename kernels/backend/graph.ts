/**
 * One TensorFlow graph call for a whole TF.js computation on native TensorFlow (tfjs-node and
 * -gpu). An eager op costs 15-40 us of dispatch through the addon (bench/results/README.md); a
 * 10-step sample of a small model is thousands of tiny ops, so dispatch, not arithmetic, is what a
 * robot waits for. Here the same TypeScript model runs once eagerly while every op it issues to
 * the addon (`executeOp`) is recorded; the record becomes a GraphDef, loaded as a SavedModel
 * session (the one graph entry point tfjs-node's binding has: `loadSavedModel` /
 * `runSavedModel`), and later calls run that session once: TensorFlow's executor and Grappler
 * take over dispatch, with no host round trip inside.
 *
 * What a graph computes is fixed by its trace: its inputs are the tensors given as `inputs` and
 * the host arrays given as `hostInputs` (matched by object identity where the traced code makes a
 * tensor from them, e.g. `tf.tensor2d(batch.state)`); every other value the code reads (a tensor
 * made from a new host array, a tensor that existed before the trace) is baked in as a constant.
 * So a caller keys its graphs on everything that may change those constants (shapes, step count,
 * which camera slots are filled) and passes everything that changes per call as inputs.
 * Reading a traced tensor's data inside the trace (a host round trip) cannot be a graph and
 * throws GraphTraceError.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import * as tf from '@tensorflow/tfjs';

type TypedArray = Float32Array | Int32Array | Uint8Array;

/** An attribute as tfjs-node hands it to the addon. */
interface OpAttr {
  name: string;
  type: number;
  value: unknown;
}
/** Output metadata the addon returns. */
interface TensorMeta {
  id: number;
  shape: number[];
  dtype: number;
}
interface Binding {
  executeOp(name: string, attrs: OpAttr[], inputs: number[], outputs: number): TensorMeta[];
  createTensor(shape: number[], dtype: number, values: TypedArray): number;
  tensorDataSync(id: number): TypedArray;
  loadSavedModel(dir: string, tags: string): number;
  runSavedModel(id: number, inputs: number[], inputNames: string, outputNames: string): TensorMeta[];
  deleteSavedModel(id: number): void;
  deleteTensor(id: number): void;
  TF_FLOAT: number;
  TF_INT32: number;
  TF_BOOL: number;
  TF_ATTR_STRING: number;
  TF_ATTR_INT: number;
  TF_ATTR_FLOAT: number;
  TF_ATTR_BOOL: number;
  TF_ATTR_TYPE: number;
  TF_ATTR_SHAPE: number;
}
interface NodeBackend {
  binding: Binding;
  /** tfjs-node keeps a new tensor's values in JS until an op first uses it (values, id -1). */
  tensorMap: { get(dataId: object): { values: unknown } | undefined };
  move(dataId: object, values: unknown, shape: number[], dtype: string, refCount: number): void;
  getInputTensorIds(ts: tf.Tensor[]): number[];
  createOutputTensor(meta: TensorMeta): tf.Tensor;
}

/** Why a computation could not become a graph (the caller runs it eagerly instead). */
export class GraphTraceError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'GraphTraceError';
  }
}

/** The native backend's internals, or null on any other backend. */
function nodeBackend(): NodeBackend | null {
  if (tf.getBackend() !== 'tensorflow') return null;
  const b = tf.backend() as unknown as Partial<NodeBackend>;
  return b.binding && typeof b.binding.runSavedModel === 'function' && typeof b.getInputTensorIds === 'function' ? (b as NodeBackend) : null;
}

/** Whether graphs can be made here (the active backend is native TensorFlow). */
export function graphsAvailable(): boolean {
  return nodeBackend() !== null;
}

/** VELA_GRAPHS values that turn graphs off. */
const OFF = new Set(['0', 'false', 'off', 'no']);

/**
 * Whether the kernels make graphs: native TensorFlow is active and VELA_GRAPHS is not `0` (or
 * `false`, `off`, `no`); read at each call, so tests and benches can compare both ways in one
 * process.
 */
export function graphsEnabled(): boolean {
  return !graphsOff() && graphsAvailable();
}

/** Whether VELA_GRAPHS turns graphs off. */
export function graphsOff(env: NodeJS.ProcessEnv = process.env): boolean {
  return OFF.has((env.VELA_GRAPHS ?? '').trim().toLowerCase());
}

// tfjs-node ships TensorFlow's protos (SavedModel, GraphDef, ...) compiled for google-protobuf.
type Msg = Record<string, (...a: unknown[]) => unknown>;
type Ctor = new () => Msg;
let protoCache: Record<string, unknown> | undefined;
function protos(): { [k: string]: Ctor } & { AttrValue: Ctor & { ListValue: Ctor }; TensorShape: Ctor & { Dim: Ctor }; MetaGraphDef: Ctor & { MetaInfoDef: Ctor } } {
  if (!protoCache) {
    const require = createRequire(import.meta.url);
    let mod: Record<string, unknown> | undefined;
    for (const p of ['@tensorflow/tfjs-node', '@tensorflow/tfjs-node-gpu']) {
      try {
        mod = require(`${p}/dist/proto/api_pb.js`) as typeof mod;
        break;
      } catch {
        // try the other package
      }
    }
    if (!mod?.GraphDef) throw new GraphTraceError("tfjs-node's TensorFlow protos (dist/proto/api_pb.js) are missing");
    protoCache = mod;
  }
  return protoCache as never;
}

interface Node {
  name: string;
  op: string;
  inputs: string[];
  attrs: OpAttr[];
  /** Const nodes: the value, dtype and shape. */
  value?: { dtype: number; shape: number[]; data: TypedArray };
  /** Placeholder nodes: dtype and shape. */
  placeholder?: { dtype: number; shape: number[] };
}

/**
 * Type attributes tfjs-node leaves for eager TensorFlow to infer from the inputs, which a
 * GraphDef must state: op -> [attribute, input whose dtype it is].
 */
const INFERRED_ATTRS: Record<string, [string, number][]> = {
  ExpandDims: [
    ['T', 0],
    ['Tdim', 1],
  ],
};

/** Constants the trace makes from host arrays above this many elements are refused. */
const MAX_CONST_ELEMENTS = 1 << 20;
/**
 * A float tensor made before the trace and read without being declared is baked in as a constant
 * only up to this size (a scalar, a small table): a larger one is most likely a weight, which a
 * later call must see as it is then, not as it was at the trace.
 */
const MAX_CAPTURED_FLOATS = 1024;

/**
 * Process memory a loaded graph holds per recorded op, bytes, beside its constants: TensorFlow's
 * graph, its Grappler-optimised copy and the executor's per-node state after a run. Measured on
 * flow0-tiny samples (native backend, RSS after the trace and a second run, less an eager run's
 * warm-up): batch 8 x 100 steps (24,899 ops) +494 MiB, 20.3 KB per op; batch 8 x 300 steps
 * ~11 KB per op; a batch-1 20-step graph (6,875 ops) ~11 KB per op; freed by dispose and reused
 * by the next graph (bench/results/graph-memory.json).
 */
export const GRAPH_BYTES_PER_OP = 20 * 1024;

/** A traced computation, runnable as one session call. Dispose it to free the session. */
export class GraphFunction {
  private disposed = false;
  // The addon takes the names comma-joined at every call.
  private readonly inputList: string;
  private readonly outputList: string;
  constructor(
    private readonly backend: NodeBackend,
    private readonly session: number,
    private readonly inputNames: string[],
    /** Per graph input: the position among the declared inputs, or -1 - k for hostInputs[k]. */
    private readonly inputSources: number[],
    private readonly hostShapes: Map<number, { shape: number[]; dtype: number }>,
    private readonly outputNames: string[],
    /** Ops the trace recorded (what eager dispatch would have issued). */
    readonly opCount: number,
    /** Bytes of the constants baked into the graph (they are held twice: the GraphDef and TensorFlow's tensors). */
    readonly constBytes = 0,
  ) {
    this.inputList = inputNames.join(',');
    this.outputList = outputNames.join(',');
  }

  /**
   * Runs the graph on `inputs` (same shapes and dtypes as at the trace, in the same order) and
   * `hostInputs` (same lengths): the outputs, new tensors the caller owns.
   * @throws GraphTraceError when disposed or an input's shape differs; TensorFlow's error text
   *   when the session fails.
   */
  run(inputs: tf.Tensor[], hostInputs: TypedArray[] = []): tf.Tensor[] {
    if (this.disposed) throw new GraphTraceError('graph function used after dispose');
    const b = this.backend.binding;
    const made: number[] = [];
    const ids = this.backend.getInputTensorIds(inputs);
    try {
      const feed = this.inputSources.map((src) => {
        if (src >= 0) return ids[src]!;
        const k = -1 - src;
        const meta = this.hostShapes.get(k)!;
        const arr = hostInputs[k];
        if (!arr || arr.length !== tf.util.sizeFromShape(meta.shape)) throw new GraphTraceError(`host input ${k} has ${arr?.length ?? 0} values; the graph was traced with ${tf.util.sizeFromShape(meta.shape)}`);
        const id = b.createTensor(meta.shape, meta.dtype, arr);
        made.push(id);
        return id;
      });
      const out = b.runSavedModel(this.session, feed, this.inputList, this.outputList);
      return out.map((m) => this.backend.createOutputTensor(m));
    } finally {
      for (const id of made) b.deleteTensor(id);
    }
  }

  /**
   * What this graph holds in the process while loaded, bytes (an estimate): GRAPH_BYTES_PER_OP per
   * recorded op plus its constants twice. Graph caches bound their total by it (kernels/graph-cache.ts).
   */
  get heldBytes(): number {
    return this.opCount * GRAPH_BYTES_PER_OP + 2 * this.constBytes;
  }

  /** Frees the TensorFlow session (idempotent). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.backend.binding.deleteSavedModel(this.session);
  }
}

/**
 * Runs `fn` eagerly while recording its ops, and returns its outputs with a GraphFunction that
 * computes the same from new inputs in one TensorFlow call. `fn` declares its graph inputs by
 * passing them through `input` (in the order GraphFunction.run takes them; a tensor declared twice
 * is one input) and may read tensors made from `hostInputs` (matched by identity) and constants;
 * it may run inside tf.tidy.
 * @throws GraphTraceError off the native backend, on a host read of a traced tensor, on a float
 *   tensor of over 1,024 values made before the trace and not declared (a weight), on a constant
 *   of over 2^20 values, when a host input is never made into a tensor, or when TensorFlow refuses
 *   the graph (the eager outputs are disposed then; so is whatever fn made when it throws), or
 *   when `opts.maxOps` is given and fn issues more ops than that (stopped at once, before the op past it).
 */
export function traceGraph(fn: (input: (t: tf.Tensor) => tf.Tensor) => tf.Tensor[], hostInputs: TypedArray[] = [], opts: { maxOps?: number } = {}): { outputs: tf.Tensor[]; graph: GraphFunction } {
  const maxOps = opts.maxOps ?? Infinity;
  const backend = nodeBackend();
  if (!backend) throw new GraphTraceError('graphs need the native TensorFlow backend');
  const b = backend.binding;
  const nodes: Node[] = [];
  /** binding tensor id -> "node:index" */
  const produced = new Map<number, string>();
  const hostIndex = new Map<TypedArray, number>(hostInputs.map((a, i) => [a, i]));
  const hostShapes = new Map<number, { shape: number[]; dtype: number }>();
  const inputSources: number[] = [];
  const inputNames: string[] = [];
  /** "node:index" -> TF_DataType */
  const dtypeOf = new Map<string, number>();
  let declared = 0;
  let ops = 0;
  let constBytes = 0;

  const placeholder = (src: number, dtype: number, shape: number[]): string => {
    const name = `input_${inputNames.length}`;
    nodes.push({ name, op: 'Placeholder', inputs: [], attrs: [], placeholder: { dtype, shape } });
    inputNames.push(`${name}:0`);
    inputSources.push(src);
    dtypeOf.set(`${name}:0`, dtype);
    return `${name}:0`;
  };
  const constant = (id: number, dtype: number, shape: number[], data: TypedArray): string => {
    const n = tf.util.sizeFromShape(shape);
    if (n > MAX_CONST_ELEMENTS) throw new GraphTraceError(`a tensor of shape [${shape}] that the trace did not make would be baked in as a constant; declare it as an input`);
    const name = `const_${nodes.length}`;
    nodes.push({ name, op: 'Const', inputs: [], attrs: [], value: { dtype, shape, data: data.slice() as TypedArray } });
    constBytes += data.byteLength;
    dtypeOf.set(`${name}:0`, dtype);
    produced.set(id, `${name}:0`);
    return `${name}:0`;
  };
  const declaredIds = new Set<number>();
  let declaring = false; // a declared input's first upload is not a constant
  const input = (t: tf.Tensor): tf.Tensor => {
    declaring = true;
    let id: number | undefined;
    try {
      [id] = getIds.call(backend, [t]);
    } finally {
      declaring = false;
    }
    if (declaredIds.has(id!)) {
      // The same tensor under a second name (tied weights): an unused placeholder keeps positions.
      placeholder(declared++, b[dtypeKey(t.dtype)] as number, [...t.shape]);
      return t;
    }
    declaredIds.add(id!);
    if (produced.has(id!)) throw new GraphTraceError('a graph input must exist before the trace reads it');
    produced.set(id!, placeholder(declared++, b[dtypeKey(t.dtype)] as number, [...t.shape]));
    return t;
  };
  const metaOf = new Map<number, { shape: number[]; dtype: number }>();

  const getIds = backend.getInputTensorIds;
  const { executeOp, createTensor, tensorDataSync } = b;
  // The addon's functions are read-only: the backend gets a stand-in binding for the trace.
  const tracer = {} as Record<string, unknown>;
  for (const k of Object.getOwnPropertyNames(b)) tracer[k] = (b as unknown as Record<string, unknown>)[k];
  const t = tracer as unknown as Binding;
  backend.binding = t;
  const ownIds = Object.prototype.hasOwnProperty.call(backend, 'getInputTensorIds') ? backend.getInputTensorIds : undefined;
  const ownMove = Object.prototype.hasOwnProperty.call(backend, 'move') ? backend.move : undefined;
  const move = backend.move;
  /** Tensors TF.js made during the trace (the others existed before it). */
  const made = new WeakSet<object>();
  /** The tensor being uploaded existed before the trace and was never used by an op. */
  let capturing = false;
  let outputs: tf.Tensor[] = [];
  try {
    backend.move = function (dataId, values, shape, dtype, refCount) {
      made.add(dataId);
      return move.call(this, dataId, values, shape, dtype, refCount);
    };
    // Shapes of tensors that existed before the trace, should they be read as constants.
    backend.getInputTensorIds = function (ts: tf.Tensor[]) {
      return ts.map((x) => {
        capturing = !made.has(x.dataId) && this.tensorMap.get(x.dataId)?.values != null;
        let id: number;
        try {
          [id] = getIds.call(this, [x]) as [number];
        } finally {
          capturing = false;
        }
        if (!metaOf.has(id)) metaOf.set(id, { shape: [...x.shape], dtype: b[dtypeKey(x.dtype)] });
        return id;
      });
    };
    t.createTensor = (shape, dtype, values) => {
      const id = createTensor.call(b, shape, dtype, values);
      if (declaring) return id;
      if (capturing && dtype === b.TF_FLOAT && values.length > MAX_CAPTURED_FLOATS) {
        throw new GraphTraceError(`the trace reads a float tensor of shape [${shape}] that existed before it and is not declared as an input (a weight would be frozen at its value now)`);
      }
      const k = hostIndex.get(values);
      if (k !== undefined) {
        const prev = hostShapes.get(k);
        if (!prev) {
          hostShapes.set(k, { shape, dtype });
          produced.set(id, placeholder(-1 - k, dtype, shape));
        } else {
          const name = inputNames[inputSources.indexOf(-1 - k)]!;
          produced.set(id, name);
        }
      } else produced.set(id, constant(id, dtype, shape, values));
      return id;
    };
    t.tensorDataSync = (id) => {
      if (produced.has(id) && !produced.get(id)!.startsWith('const_')) throw new GraphTraceError('the computation reads a traced tensor on the host (a round trip a graph cannot make)');
      return tensorDataSync.call(b, id);
    };
    t.executeOp = (name, attrs, ids, numOutputs) => {
      const ins = ids.map((id) => {
        const have = produced.get(id);
        if (have) return have;
        // A tensor that existed before the trace and is not an input: a constant.
        const data = tensorDataSync.call(b, id);
        const meta = metaOf.get(id) ?? { shape: [data.length], dtype: data instanceof Float32Array ? b.TF_FLOAT : b.TF_INT32 };
        if (meta.dtype === b.TF_FLOAT && data.length > MAX_CAPTURED_FLOATS) {
          throw new GraphTraceError(`the trace reads a float tensor of shape [${meta.shape}] that existed before it and is not declared as an input (a weight would be frozen at its value now)`);
        }
        return constant(id, meta.dtype, meta.shape, data);
      });
      // A computation past the cache's whole budget would be evicted at once: stop recording it
      // (the trace's nodes and the graph TensorFlow would build are what an unrolled loop costs).
      if (ops >= maxOps) throw new GraphTraceError(`the computation issues more than ${maxOps} ops; it runs eagerly`);
      const out = executeOp.call(b, name, attrs, ids, numOutputs);
      const nodeName = `op_${nodes.length}`;
      const more = (INFERRED_ATTRS[name] ?? []).filter(([a]) => !attrs.some((x) => x.name === a)).map(([a, i]) => ({ name: a, type: b.TF_ATTR_TYPE, value: dtypeOf.get(ins[i]!) }));
      if (more.some((m) => m.value === undefined)) throw new GraphTraceError(`${name}: the dtype of an input is unknown`);
      nodes.push({ name: nodeName, op: name, inputs: ins, attrs: more.length ? [...attrs, ...more] : attrs });
      ops++;
      out.forEach((m, i) => {
        produced.set(m.id, `${nodeName}:${i}`);
        dtypeOf.set(`${nodeName}:${i}`, m.dtype);
        metaOf.set(m.id, { shape: m.shape, dtype: m.dtype });
      });
      return out;
    };
    // A throw inside fn (a refusal above, or the model's own error) frees what fn made.
    outputs = tf.tidy(() => fn(input));
  } finally {
    backend.binding = b;
    if (ownIds) backend.getInputTensorIds = ownIds;
    else delete (backend as Partial<NodeBackend>).getInputTensorIds;
    if (ownMove) backend.move = ownMove;
    else delete (backend as Partial<NodeBackend>).move;
  }
  try {
    const unused = hostInputs.findIndex((_, k) => !hostShapes.has(k));
    if (unused >= 0) throw new GraphTraceError(`host input ${unused} never became a tensor in the trace (a copy of it would be baked in)`);
    const outIds = backend.getInputTensorIds(outputs);
    const outputNames = outIds.map((id, i) => {
      const src = produced.get(id);
      if (!src) throw new GraphTraceError(`output ${i} was not computed by the trace`);
      const name = `output_${i}`;
      nodes.push({ name, op: 'Identity', inputs: [src], attrs: [{ name: 'T', type: b.TF_ATTR_TYPE, value: b[dtypeKey(outputs[i]!.dtype)] }] });
      return `${name}:0`;
    });
    const t0 = performance.now();
    const session = loadGraph(b, nodes);
    if (process.env.VELA_GRAPH_DEBUG) {
      console.error(`graph: ${ops} ops, ${nodes.length} nodes, loaded in ${(performance.now() - t0).toFixed(0)} ms`);
      if (process.env.VELA_GRAPH_DEBUG === 'ops') {
        const count = new Map<string, number>();
        for (const n of nodes) count.set(n.op, (count.get(n.op) ?? 0) + 1);
        console.error([...count].sort((a, b) => b[1] - a[1]).map(([k, v]) => `${v} ${k}`).join(', '));
      }
    }
    return { outputs, graph: new GraphFunction(backend, session, inputNames, inputSources, hostShapes, outputNames, ops, constBytes) };
  } catch (err) {
    tf.dispose(outputs);
    throw err;
  }
}

function dtypeKey(dtype: tf.DataType): 'TF_FLOAT' | 'TF_INT32' | 'TF_BOOL' {
  if (dtype === 'float32') return 'TF_FLOAT';
  if (dtype === 'int32') return 'TF_INT32';
  if (dtype === 'bool') return 'TF_BOOL';
  throw new GraphTraceError(`dtype ${dtype} cannot be a graph input or output`);
}

/** The shape proto of `dims`. */
function shapeProto(P: ReturnType<typeof protos>, dims: number[]): Msg {
  const s = new P.TensorShape();
  for (const d of dims) {
    const dim = new P.TensorShape.Dim();
    dim.setSize!(d);
    s.addDim!(dim);
  }
  return s;
}

function attrProto(P: ReturnType<typeof protos>, b: Binding, a: OpAttr): Msg {
  const v = new P.AttrValue();
  const list = Array.isArray(a.value);
  const vals = (list ? a.value : [a.value]) as unknown[];
  const L = list ? new P.AttrValue.ListValue() : null;
  switch (a.type) {
    case b.TF_ATTR_STRING:
      if (L) L.setSList!(vals.map((x) => Buffer.from(String(x))));
      else v.setS!(Buffer.from(String(a.value)));
      break;
    case b.TF_ATTR_INT:
      if (L) L.setIList!(vals);
      else v.setI!(a.value);
      break;
    case b.TF_ATTR_FLOAT:
      if (L) L.setFList!(vals);
      else v.setF!(a.value);
      break;
    case b.TF_ATTR_BOOL:
      if (L) L.setBList!(vals);
      else v.setB!(a.value);
      break;
    case b.TF_ATTR_TYPE:
      if (L) L.setTypeList!(vals);
      else v.setType!(a.value);
      break;
    case b.TF_ATTR_SHAPE:
      v.setShape!(shapeProto(P, a.value as number[]));
      return v;
    default:
      throw new GraphTraceError(`attribute ${a.name} has a type (${a.type}) graphs do not take`);
  }
  if (L) v.setList!(L);
  return v;
}

let graphSeq = 0;

/**
 * Writes `nodes` as a SavedModel (no variables) and loads it as a session: its id. The addon
 * loads graphs only from a folder, so this is the kernels' one write: a private temp folder,
 * removed as soon as TensorFlow has read it. VELA_GRAPH_DEBUG prints sizes and times on stderr.
 */
function loadGraph(b: Binding, nodes: Node[]): number {
  const P = protos();
  const graph = new P.GraphDef();
  for (const n of nodes) {
    const nd = new P.NodeDef();
    nd.setName!(n.name);
    nd.setOp!(n.op);
    nd.setInputList!(n.inputs);
    const attrs = nd.getAttrMap!() as { set(k: string, v: Msg): void };
    if (n.value) {
      const t = new P.Tensor();
      t.setDtype!(n.value.dtype);
      t.setTensorShape!(shapeProto(P, n.value.shape));
      t.setTensorContent!(new Uint8Array(n.value.data.buffer, n.value.data.byteOffset, n.value.data.byteLength));
      const dt = new P.AttrValue();
      dt.setType!(n.value.dtype);
      const tv = new P.AttrValue();
      tv.setTensor!(t);
      attrs.set('dtype', dt);
      attrs.set('value', tv);
    } else if (n.placeholder) {
      const dt = new P.AttrValue();
      dt.setType!(n.placeholder.dtype);
      const sh = new P.AttrValue();
      sh.setShape!(shapeProto(P, n.placeholder.shape));
      attrs.set('dtype', dt);
      attrs.set('shape', sh);
    } else {
      for (const a of n.attrs) attrs.set(a.name, attrProto(P, b, a));
    }
    graph.addNode!(nd);
  }
  const versions = new P.VersionDef();
  versions.setProducer!(1395);
  graph.setVersions!(versions);
  const info = new P.MetaGraphDef.MetaInfoDef();
  info.addTags!('serve');
  const meta = new P.MetaGraphDef();
  meta.setMetaInfoDef!(info);
  meta.setGraphDef!(graph);
  const sm = new P.SavedModel();
  sm.setSavedModelSchemaVersion!(1);
  sm.addMetaGraphs!(meta);
  const t0 = performance.now();
  const bytes = sm.serializeBinary!() as Uint8Array;
  if (process.env.VELA_GRAPH_DEBUG) console.error(`graph: proto ${bytes.length} bytes in ${(performance.now() - t0).toFixed(0)} ms`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `vela-graph-${process.pid}-${graphSeq++}-`));
  try {
    fs.writeFileSync(path.join(dir, 'saved_model.pb'), bytes);
    try {
      return b.loadSavedModel(dir, 'serve');
    } catch (err) {
      throw new GraphTraceError(`TensorFlow refused the traced graph: ${(err as Error).message.slice(0, 400)}`);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
