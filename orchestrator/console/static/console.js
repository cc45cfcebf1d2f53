// Skillrun console: follows a run's page live over its event stream (server-sent events), then reloads the page
// once the run has ended so that its output and files show. Pages work without it (they refresh themselves).
"use strict";

(function () {
  const status = document.getElementById("run-status");
  if (!status || status.dataset.ended === "true" || !window.EventSource) {
    return;
  }
  const list = document.getElementById("events");
  const shown = list.querySelectorAll("li.event").length; // events the page was rendered with
  const statusOf = {
    queued: "queued", requeued: "queued", retried: "queued", started: "started", cancelling: "started",
    finished: "finished", failed: "failed", cancelled: "cancelled",
  };
  const ending = new Set(["finished", "failed", "cancelled"]);
  let received = 0;
  const source = new EventSource(status.dataset.events);

  function add(type, data) {
    const item = document.createElement("li");
    item.className = "event";
    item.dataset.type = type;
    const label = document.createElement("span");
    label.className = "state state-" + type;
    label.textContent = type;
    item.append(label, " ");
    const time = document.createElement("time");
    time.textContent = data && data.at ? new Date(data.at * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "";
    item.append(time);
    const reason = data && data.data && data.data.reason;
    if (reason) {
      const note = document.createElement("small");
      note.textContent = " " + String(reason);
      item.append(note);
    }
    list.append(item);
  }

  function onEvent(type, event) {
    const data = JSON.parse(event.data);
    received += 1;
    if (received > shown) {
      add(type, data);
    }
    if (statusOf[type]) {
      status.dataset.status = statusOf[type];
      status.textContent = statusOf[type];
      status.className = "state state-" + statusOf[type];
    }
    if (ending.has(type)) {
      source.close();
      window.location.reload();
    }
  }

  source.addEventListener("open", function () { received = 0; }); // a reconnected stream starts from the first event
  Object.keys(statusOf).forEach(function (type) {
    source.addEventListener(type, function (event) { onEvent(type, event); });
  });
  ["closing", "lost", "unavailable"].forEach(function (type) {
    source.addEventListener(type, function (event) {
      source.close();
      const data = JSON.parse(event.data);
      add(type, {data: data});
      if (type !== "lost") {
        window.setTimeout(function () { window.location.reload(); }, 1000 * (data.retry_after || 2));
      }
    });
  });
})();
