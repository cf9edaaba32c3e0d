// nginx and HAProxy as baseline proxies, each with one worker and keepalive
// connections to the upstream, configured for a fair comparison with one
// Switchyard process.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { start, type Proc } from './proc.js';

export function which(cmd: string): string | null {
  for (const d of ['/usr/sbin', '/usr/bin', '/usr/local/sbin', '/usr/local/bin']) {
    try {
      execFileSync('test', ['-x', join(d, cmd)]);
      return join(d, cmd);
    } catch {
      // not in this folder
    }
  }
  return null;
}

export const NGINX_CONF = (port: number, upstreamPort: number, dir: string) => `
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  client_max_body_size 16m;
  upstream engine { server 127.0.0.1:${upstreamPort}; keepalive 256; }
  server {
    listen 127.0.0.1:${port} backlog=4096;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`;

export const HAPROXY_CONF = (port: number, upstreamPort: number) => `
global
  nbthread 1
  maxconn 8192
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
  http-reuse always
frontend fe
  bind 127.0.0.1:${port}
  default_backend be
backend be
  server engine 127.0.0.1:${upstreamPort} maxconn 1024
`;

/** A command and its arguments, under `taskset -c <cpus>` when `cpus` is given (the pid stays the command's: taskset execs it). */
export function pinned(cpus: string | undefined, cmd: string, args: string[]): [string, string[]] {
  return cpus ? ['taskset', ['-c', cpus, cmd, ...args]] : [cmd, args];
}

/** `cpus`: pin it with `taskset -c <cpus>` (Linux). */
export function startNginx(port: number, upstreamPort: number, cpus?: string): Proc | null {
  const bin = which('nginx');
  if (!bin) return null;
  const dir = mkdtempSync(join(tmpdir(), 'swy-nginx-'));
  for (const d of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(join(dir, d));
  writeFileSync(join(dir, 'nginx.conf'), NGINX_CONF(port, upstreamPort, dir));
  return start('nginx', ...pinned(cpus, bin, ['-c', join(dir, 'nginx.conf'), '-p', dir]));
}

/** `cpus`: pin it with `taskset -c <cpus>` (Linux). */
export function startHaproxy(port: number, upstreamPort: number, cpus?: string): Proc | null {
  const bin = which('haproxy');
  if (!bin) return null;
  const dir = mkdtempSync(join(tmpdir(), 'swy-haproxy-'));
  writeFileSync(join(dir, 'haproxy.cfg'), HAPROXY_CONF(port, upstreamPort));
  return start('haproxy', ...pinned(cpus, bin, ['-db', '-f', join(dir, 'haproxy.cfg')]));
}

/** nginx round-robin over several upstream ports (its default balancing), one worker, keepalive. */
export function startNginxRoundRobin(port: number, upstreamPorts: readonly number[]): Proc | null {
  const bin = which('nginx');
  if (!bin) return null;
  const dir = mkdtempSync(join(tmpdir(), 'swy-nginx-rr-'));
  for (const d of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(join(dir, d));
  const servers = upstreamPorts.map((p) => `server 127.0.0.1:${p};`).join(' ');
  writeFileSync(join(dir, 'nginx.conf'), NGINX_CONF(port, upstreamPorts[0]!, dir).replace(/upstream engine \{[^}]*\}/, `upstream engine { ${servers} keepalive 256; }`)
      // prompts of several KB: held in memory (a worker without write access to the temp folder would fail them)
      .replace('client_max_body_size 16m;', 'client_max_body_size 16m;\n  client_body_buffer_size 16m;'));
  return start('nginx', bin, ['-c', join(dir, 'nginx.conf'), '-p', dir]);
}
