/**
 * The server log (server/log.ts): one record is one line, so a message that quotes another
 * program's multi-line output (ffmpeg's) cannot leave lines without a time, level or subject.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { log } from '../server/log.ts';

afterEach(() => {
  vi.restoreAllMocks();
  log.setLevel(process.env.VELA_TEST_LOG ?? 'error');
});

describe('server log', () => {
  it('writes a multi-line message as one line, and honours the level', () => {
    const lines: string[] = [];
    vi.spyOn(process.stderr, 'write').mockImplementation((chunk: any) => (lines.push(String(chunk)), true));
    log.setLevel('warn');
    log.warn('job ft-1 failed: video file e.mp4: ffmpeg said: moov atom not found\r\ne.mp4: Invalid data found when processing input');
    log.info('not shown at warn');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^\d{4}-\d\d-\d\dT\S+Z warn  job ft-1 failed: video file e\.mp4: ffmpeg said: moov atom not found \\n e\.mp4: Invalid data found when processing input\n$/);
    expect(() => log.setLevel('loud')).toThrow('log level must be one of error, warn, info, debug, got "loud"');
  });

  it('keeps the last 50 warn and error lines whatever the level, oldest first, without info or debug', () => {
    vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
    log.setLevel('error');
    for (let i = 0; i < 60; i++) log.warn(`hidden warning ${i}`);
    log.info('an info line');
    log.error('a failure', new Error('its cause'));
    const kept = log.recent();
    expect(kept).toHaveLength(50);
    expect(kept[0]).toMatch(/ warn  hidden warning 11$/);
    expect(kept.at(-2)).toMatch(/ warn  hidden warning 59$/);
    expect(kept.at(-1)).toMatch(/ error a failure \(its cause\)$/);
  });
});
