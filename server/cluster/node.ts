/**
 * This process as a node of a cluster (`VELA_DATABASE_URL` set): it registers itself in the
 * shared store (id, public URL, presets, session capacity), heartbeats every
 * `--node-heartbeat-s`, and at each beat looks for nodes whose heartbeat is older than
 * `--node-lost-s`. Declaring a node lost is one statement, so exactly one surviving node handles
 * each lost node: its open sessions become `lost` (their engine memory died with it) and its
 * job goes back to the queue, to resume from its last checkpoint on any node.
 *
 * A node that finds itself declared lost (it was cut off from the database for too long) is
 * fenced: its work already belongs to others, so it stops its job without writing more, closes
 * its sessions, and registers again once the job has stopped.
 */
import { PRESETS } from '../../kernels/small/config.ts';
import { log } from '../log.ts';
import type { NodeLoad, NodeRow, Store } from '../store/store.ts';

export interface NodeOptions {
  id: string;
  url: string;
  capacity: number;
  heartbeatS: number;
  lostS: number;
  /** The load reported at each heartbeat. */
  load: () => NodeLoad;
  /** Hand the jobs held by these queue workers (of lost nodes) back to the queue. */
  releaseJobs: (queueWorkers: string[]) => Promise<void>;
  /** Called once when this node learns it was declared lost. */
  onFenced: (reason: string) => Promise<void>;
  /** True while this node still runs a job (a fenced node re-registers only after it stopped). */
  busy: () => boolean;
}

export class ClusterNode {
  private timer: NodeJS.Timeout | null = null;
  private fencedSince: number | null = null;
  /** Since when this node's heartbeats reach the database without a gap (null: the last one failed). */
  private beatingSince: number | null = null;
  private beating: Promise<void> = Promise.resolve();
  /** Nodes as last read (placement, URLs), refreshed at each heartbeat. */
  private nodes = new Map<string, NodeRow>();

  constructor(private store: Store, readonly opts: NodeOptions) {}

  get id(): string {
    return this.opts.id;
  }

  /** True from the moment this node learns it was declared lost until it registers again. */
  fenced(): boolean {
    return this.fencedSince !== null;
  }

  /**
   * Register and start heartbeating. A previous life of this node id (a crash, then a restart
   * faster than `--node-lost-s`) left sessions whose memory is gone: they become `lost`.
   */
  async start(): Promise<void> {
    const before = await this.store.getNode(this.id);
    if (before?.status === 'up') {
      const ids = await this.store.loseNodeSessions(this.id, `node ${this.id} restarted; session memory is lost (load a saved state in a new session)`);
      if (ids.length > 0) log.info(`node ${this.id} restarted: ${ids.length} session(s) of its previous run marked lost`);
    }
    // The job of this id's previous life (dead: this id is ours) is claimable again, here or elsewhere.
    if (before?.queue_worker) await this.opts.releaseJobs([before.queue_worker]);
    await this.store.registerNode({ id: this.id, url: this.opts.url, presets: Object.keys(PRESETS), capacity: this.opts.capacity, load: this.opts.load() });
    await this.refresh();
    log.info(`node ${this.id} registered (${this.opts.url}); heartbeat every ${this.opts.heartbeatS} s, lost after ${this.opts.lostS} s`);
    this.beatingSince = Date.now();
    this.timer = setInterval(() => {
      this.beating = this.beating.then(() => this.beat()).catch((e) => {
        this.beatingSince = null;
        log.warn(`node ${this.id}: heartbeat failed: ${(e as Error).message}`);
      });
    }, this.opts.heartbeatS * 1000);
  }

  /** One heartbeat: record ours, handle nodes that stopped beating, refresh the node list. */
  private async beat(): Promise<void> {
    if (this.fencedSince !== null) {
      if (this.opts.busy()) return;
      await this.store.registerNode({ id: this.id, url: this.opts.url, presets: Object.keys(PRESETS), capacity: this.opts.capacity, load: this.opts.load() });
      log.warn(`node ${this.id} registered again after being declared lost`);
      this.fencedSince = null;
    } else if (!(await this.store.heartbeatNode(this.id, this.opts.load()))) {
      this.fencedSince = Date.now();
      const reason = `node ${this.id} was declared lost by the cluster (no heartbeat reached the database for ${this.opts.lostS} s)`;
      log.error(`${reason}: its sessions and job now belong to other nodes; stopping them here`);
      await this.opts.onFenced(reason);
      return;
    }
    // After a gap in our own heartbeats (the database was unreachable), the others' beats stopped
    // for the same reason: give them a full lost period to beat again before judging them.
    this.beatingSince ??= Date.now();
    if (Date.now() - this.beatingSince >= this.opts.lostS * 1000) {
      for (const lost of await this.store.markLostNodes(this.opts.lostS * 1000)) await this.handleLost(lost);
    }
    await this.refresh();
  }

  /** A node this one declared lost: its sessions become `lost`, its job is released to the queue. */
  private async handleLost(nodeId: string): Promise<void> {
    const reason = `node ${nodeId} was lost (no heartbeat for ${this.opts.lostS} s); its session memory is gone: load the last checkpoint in a new session`;
    const sessions = await this.store.loseNodeSessions(nodeId, reason);
    const worker = (await this.store.getNode(nodeId))?.queue_worker;
    if (worker) await this.opts.releaseJobs([worker]);
    log.warn(`node ${nodeId} lost: ${sessions.length} session(s) marked lost, its job released to the queue`);
  }

  private async refresh(): Promise<void> {
    this.nodes = new Map((await this.store.listNodes()).map((n) => [n.id, n]));
  }

  /** The public URL of a node (as last read), or null when unknown. */
  urlOf(nodeId: string): string | null {
    return nodeId === this.id ? this.opts.url : (this.nodes.get(nodeId)?.url ?? null);
  }

  /** A node as last read. */
  node(nodeId: string): NodeRow | null {
    return this.nodes.get(nodeId) ?? null;
  }

  /**
   * The node for a new session of `preset`: among nodes that are up, beating and below their
   * capacity, the one with the fewest open sessions; ties go to a node whose engine for the
   * preset is already started (no model build), then to this node, then by id.
   * @returns null when every node is full.
   */
  async place(preset: string): Promise<NodeRow | null> {
    const [nodes, counts, ages] = await Promise.all([this.store.listNodes(), this.store.openSessionsByNode(), this.store.heartbeatAges()]);
    const lostMs = this.opts.lostS * 1000;
    const open = (n: NodeRow) => counts.get(n.id) ?? 0;
    const candidates = nodes.filter((n) => n.status === 'up' && (ages.get(n.id) ?? Infinity) < lostMs && open(n) < n.capacity && !(n.id === this.id && this.fenced()));
    const resident = (n: NodeRow) => (n.load.resident_presets.includes(preset) ? 0 : 1);
    candidates.sort((a, b) => open(a) - open(b) || resident(a) - resident(b) || Number(b.id === this.id) - Number(a.id === this.id) || a.id.localeCompare(b.id));
    return candidates[0] ?? null;
  }

  /** Stop heartbeating and mark this node `stopped` (its job was handed back by the runner). */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    await this.beating;
    await this.store.setNodeStatus(this.id, 'stopped').catch((e) => log.warn(`node ${this.id}: ${(e as Error).message}`));
  }
}
