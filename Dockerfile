# syntax=docker/dockerfile:1
# Switchyard: one image for the router (`serve`) and the engine simulator (`sim`).
#
#   docker build -t switchyard .
#   docker run --rm -p 8000:8000 switchyard                        # router + 4 simulated engines (demo)
#   docker run --rm -p 8000:8000 -v $PWD/router.yaml:/etc/switchyard/router.yaml:ro \
#     switchyard serve --config /etc/switchyard/router.yaml --host 0.0.0.0
#   docker run --rm -p 8001:8000 switchyard sim --host 0.0.0.0 --port 8000
#   docker run --rm -v $PWD/router.yaml:/r.yaml:ro switchyard check --config /r.yaml
#   docker build --target standalone -t switchyard:standalone .   # the single executable, no Node in the image
#
# Build stage: the full Node image has the addon's toolchain (python3, make,
# g++); `npm ci` runs node-gyp (the C++ addon) and tsc (dist/), `npm run
# build:binary` the standalone executable (out/switchyard, for the standalone
# stage), then the dev dependencies are pruned. Runtime stage (the default
# target, last): the slim image, the built files only, as the unprivileged
# `node` user.
# Node 24 (LTS, supported until April 2028): uWebSockets.js has no binary for it, so the router serves
# on the native front end (docs/front-end.md); test/deploy/node-version.test.ts keeps this in step with
# package.json's engines and the LTS end-of-life dates (docs/portability.md).
ARG NODE_VERSION=24.22

FROM node:${NODE_VERSION}-bookworm AS build
WORKDIR /app
COPY package.json package-lock.json binding.gyp tsconfig.json ./
COPY native ./native
COPY bindings ./bindings
COPY src ./src
COPY bench ./bench
COPY bin ./bin
COPY scripts ./scripts
COPY proto ./proto
RUN npm ci --no-audit --no-fund \
 && node bin/switchyard.js --version \
 && npm run build:binary \
 && npm prune --omit=dev --no-audit --no-fund

# The standalone executable on plain Debian: no Node, no node_modules. It unpacks itself once into
# $SWITCHYARD_EXTRACT_DIR (default /tmp/switchyard-<uid>; mount a tmpfs there with a read-only root).
# Its health check speaks HTTP/1.0 over bash's /dev/tcp (the native front end answers it).
FROM debian:bookworm-slim AS standalone
COPY --from=build /app/out/switchyard /usr/local/bin/switchyard
USER nobody
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${SWITCHYARD_HEALTH_PORT:-8000} && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && read -r v s r <&3 && [ \"$s\" = 200 ]"]
ENTRYPOINT ["switchyard"]
CMD ["serve", "--host", "0.0.0.0"]

FROM node:${NODE_VERSION}-bookworm-slim AS runtime
ENV NODE_ENV=production
WORKDIR /app
COPY --from=build /app/package.json /app/binding.gyp ./
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/bin ./bin
COPY --from=build /app/dist ./dist
# the ext_proc server loads Envoy's message definitions at run time
COPY --from=build /app/proto ./proto
COPY --from=build /app/build/Release/switchyard_native.node ./build/Release/switchyard_native.node
USER node
# the router's and the simulator's default port
EXPOSE 8000
# /healthz for `serve`, /health for `sim`, on SWITCHYARD_HEALTH_PORT (default 8000)
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 CMD ["node", "bin/healthcheck.js"]
ENTRYPOINT ["node", "bin/switchyard.js"]
CMD ["serve", "--host", "0.0.0.0"]
