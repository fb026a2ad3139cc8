// Publish messages with amqplib (Node.js), exactly as a Node service would.
// Usage: node publish_amqplib.js <amqp url> <queue> < messages.json
// messages.json: [{"body_b64": "...", "options": {...amqplib publish options...}}, ...]
// Header values may use amqplib's own typed form, e.g. {"!": "timestamp", "value": 1700000000000}.
// Prints one line per message: "ack" or "error <text>".
const amqp = require("amqplib");

async function main() {
  const [url, queue] = process.argv.slice(2);
  const messages = JSON.parse(require("fs").readFileSync(0, "utf8"));
  const conn = await amqp.connect(url);
  for (const m of messages) {
    // A fresh channel per message: the broker closes a channel that sent a frame it refuses.
    const ch = await conn.createConfirmChannel();
    ch.on("error", () => {});
    try {
      await new Promise((resolve, reject) => {
        ch.sendToQueue(queue, Buffer.from(m.body_b64, "base64"), m.options, (err) =>
          err ? reject(err) : resolve()
        );
      });
      console.log("ack");
      await ch.close();
    } catch (err) {
      console.log("error " + String(err.message || err).split("\n")[0]);
    }
  }
  await conn.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
