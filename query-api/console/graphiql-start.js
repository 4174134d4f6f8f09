// Starts the vendored GraphiQL on this origin's /graphql. No inline script: the page's CSP
// allows scripts from this origin only. The console's token (sessionStorage, this tab only)
// pre-fills the Authorization header; GraphiQL is told not to persist headers.
(function () {
  "use strict";
  var token = null;
  try { token = window.sessionStorage.getItem("ledger.console.token"); } catch (e) { token = null; }
  var headers = token ? JSON.stringify({ Authorization: "Bearer " + token }, null, 2) : "";
  var wsScheme = window.location.protocol === "https:" ? "wss:" : "ws:";
  var fetcher = GraphiQL.createFetcher({
    url: "/graphql",
    subscriptionUrl: wsScheme + "//" + window.location.host + "/graphql/ws",
  });
  var example = "# Transfers, newest first (an admin sees everyone's).\n" +
    "query Recent {\n  transfers(first: 5) {\n    nodes { reqId userId from to asset amount state createdAt }\n  }\n" +
    "  stateCounts { state count }\n}\n";
  var root = ReactDOM.createRoot(document.getElementById("graphiql"));
  root.render(React.createElement(GraphiQL, {
    fetcher: fetcher,
    defaultQuery: example,
    defaultHeaders: headers,
    headers: headers || undefined,
    shouldPersistHeaders: false,
    isHeadersEditorEnabled: true,
    defaultEditorToolsVisibility: headers ? "headers" : true,
  }));
}());
