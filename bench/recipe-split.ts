/**
 * Split A of the recipe runs (issue 16), fixed once for every row of bench/results/recipe.md:
 * g1_pick_bottle's episodes 4, 7 and 12 held out (the seed-0 20% split: 266 scored frames at
 * every 4th frame), the other 12 trained on.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const G1 = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../shared/datasets/g1_pick_bottle');
export const HELD_OUT = [4, 7, 12];
