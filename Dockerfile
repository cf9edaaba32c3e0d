# syntax=docker/dockerfile:1
# Switchyard: one image for the router (`serve`) and the engine simulator (`sim`).
#
#   docker build -t switchyard .
#   docker run --rm -p 8000:8000 switchyard                        # router + 4 simulated engines (demo)
#   docker run --rm -p 8000:8000 -v $PWD/router.yaml:/etc/switchyard/router.yaml:ro \
#     switchyard serve --config /etc/switchyard/router.yaml --host 0.0.0.0
#   docker run --rm -p 8001:8000 switchyard sim --host 0.0.0.0 --port 8000
#   docker run --rm -v $PWD/router.yaml:/r.yaml:ro switchyard check --config /r.yaml
#
# Build stage: the full Node image has the addon's toolchain (python3, make,
# g++); `npm ci` runs node-gyp (the C++ addon) and tsc (dist/), then the dev
# dependencies are pruned. Runtime stage: the slim image, the built files
# only, as the unprivileged `node` user.
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
 && npm prune --omit=dev --no-audit --no-fund

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
