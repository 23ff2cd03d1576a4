/** What every page of the dashboard is: an element, a title, and a way to stop its timers and streams. */
export interface View {
  el: HTMLElement;
  title: string;
  dispose(): void;
}

/**
 * Run `fn` now and then every `everyMs` while the view lives, skipping ticks while the tab is
 * hidden (a background tab does not need fresh tables) and never overlapping two runs.
 */
export function poll(fn: () => Promise<void>, everyMs: number): () => void {
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | null = null;
  const tick = async () => {
    if (stopped) return;
    if (document.visibilityState !== 'hidden') {
      try {
        await fn();
      } catch {
        // fn shows its own errors; polling goes on so that the page recovers by itself
      }
    }
    if (!stopped) timer = setTimeout(tick, everyMs);
  };
  void tick();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
  };
}
