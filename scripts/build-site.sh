#!/usr/bin/env bash
# Debug build of the dashboard site and the server with plain cargo: the same steps and
# artifacts as `cargo leptos build` (see shared/TOOLCHAIN.md), without installing cargo-leptos.
#
#   1. the hydrate front end: app compiled to wasm32 in its own target dir (target/front)
#   2. wasm-bindgen --target web  ->  target/site/pkg/rebound.js + rebound.wasm
#   3. style/main.css -> target/site/pkg/rebound.css, public/* -> target/site/
#   4. the server binary (target/debug/rebound-server) with the app's ssr side
#
# Idempotent: re-running on an unchanged tree rebuilds nothing. Run the server afterwards from
# the repository root (it serves target/site by default; LEPTOS_SITE_ROOT overrides).
#
# Every cargo call uses the same LEPTOS_OUTPUT_NAME and RUSTFLAGS, so `cargo test`/`clippy`
# run with the exports below reuse these artifacts instead of building everything again.
set -euo pipefail
cd "$(dirname "$0")/.."

export LEPTOS_OUTPUT_NAME=rebound
export RUSTFLAGS="--cfg erase_components"
SITE=target/site
PKG="$SITE/pkg"
WASM_BINDGEN_VERSION=0.2.129

have="$(wasm-bindgen --version 2>/dev/null || true)"
if [ "$have" != "wasm-bindgen $WASM_BINDGEN_VERSION" ]; then
    echo "build-site: need wasm-bindgen $WASM_BINDGEN_VERSION (found: ${have:-none})." >&2
    echo "  install it with: cargo install wasm-bindgen-cli --version $WASM_BINDGEN_VERSION --locked" >&2
    exit 1
fi
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    echo "build-site: the wasm32-unknown-unknown target is missing: rustup target add wasm32-unknown-unknown" >&2
    exit 1
fi

echo "build-site: front end (wasm, hydrate)" >&2
cargo build --package=app --lib --target-dir=target/front --target=wasm32-unknown-unknown \
    --no-default-features --features=hydrate

mkdir -p "$PKG"
WASM=target/front/wasm32-unknown-unknown/debug/app.wasm
# wasm-bindgen only when the wasm changed, so a no-op build stays a no-op.
if [ ! -f "$PKG/rebound.wasm" ] || [ "$WASM" -nt "$PKG/rebound.wasm" ]; then
    echo "build-site: wasm-bindgen" >&2
    wasm-bindgen --target=web --out-name=rebound --out-dir="$PKG" "$WASM"
    # Leptos' <HydrationScripts/> loads /pkg/<name>.wasm.
    mv -f "$PKG/rebound_bg.wasm" "$PKG/rebound.wasm"
fi

cp style/main.css "$PKG/rebound.css"
cp -R public/. "$SITE/"

echo "build-site: server" >&2
cargo build --package=rebound-server --bin=rebound-server

echo "build-site: done: $SITE and target/debug/rebound-server" >&2
