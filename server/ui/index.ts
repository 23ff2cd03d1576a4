/** The web dashboard: `mountUi` serves the build of ui/src (see scripts/build-ui.ts). */
export { mountUi, type UiOptions } from './serve.ts';
export { UI_DIST_DIR, loadAssets, type Asset, type AssetSet } from './assets.ts';
