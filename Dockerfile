# The kvrelay image used by docker-compose.yml.
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
COPY bin ./bin
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY bench ./bench
RUN npm ci && npm prune --omit=dev

FROM node:20-bookworm-slim
WORKDIR /app
ENV NODE_ENV=production
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY --from=build /app/bin ./bin
EXPOSE 8080 8090
# node itself is PID 1, not npm or a shell: SIGTERM from `docker stop` reaches kvrelay, which
# drains and exits 0 (npm would not forward it; see README).
STOPSIGNAL SIGTERM
ENTRYPOINT ["node", "bin/kvrelay.js"]
