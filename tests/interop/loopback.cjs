// Preloaded (`node --require`) into a Node MCP server started by the interop matrix: a server that listens on a
// port without naming a host (Express's `app.listen(PORT)`) listens on 127.0.0.1 only, as test servers must.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const port = args[0];
  const named = typeof port === "number" || (typeof port === "string" && /^\d+$/.test(port));
  if (named && (args.length === 1 || typeof args[1] === "function")) {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
