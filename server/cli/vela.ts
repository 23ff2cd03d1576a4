/**
 * The `vela` entry point (bin/vela.js and `npm start` run this file): the commands live in
 * main.ts, so that tests can run them in-process.
 */
import { runCli } from './main.ts';

process.exitCode = await runCli(process.argv.slice(2));
