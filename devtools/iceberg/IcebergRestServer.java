import com.fasterxml.jackson.annotation.JsonAutoDetect;
import com.fasterxml.jackson.annotation.PropertyAccessor;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.PropertyNamingStrategies;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.MetadataUpdate;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.TableOperations;
import org.apache.iceberg.UpdateRequirement;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.exceptions.CommitStateUnknownException;
import org.apache.iceberg.exceptions.ForbiddenException;
import org.apache.iceberg.exceptions.NamespaceNotEmptyException;
import org.apache.iceberg.exceptions.NoSuchNamespaceException;
import org.apache.iceberg.exceptions.NoSuchTableException;
import org.apache.iceberg.exceptions.NoSuchViewException;
import org.apache.iceberg.exceptions.NotAuthorizedException;
import org.apache.iceberg.exceptions.NotFoundException;
import org.apache.iceberg.exceptions.ValidationException;
import org.apache.iceberg.jdbc.JdbcCatalog;
import org.apache.iceberg.rest.CatalogHandlers;
import org.apache.iceberg.rest.Endpoint;
import org.apache.iceberg.rest.RESTCatalogProperties;
import org.apache.iceberg.rest.RESTSerializers;
import org.apache.iceberg.rest.RESTUtil;
import org.apache.iceberg.rest.requests.CommitTransactionRequest;
import org.apache.iceberg.rest.requests.CreateNamespaceRequest;
import org.apache.iceberg.rest.requests.CreateTableRequest;
import org.apache.iceberg.rest.requests.CreateViewRequest;
import org.apache.iceberg.rest.requests.RegisterTableRequest;
import org.apache.iceberg.rest.requests.RegisterViewRequest;
import org.apache.iceberg.rest.requests.RenameTableRequest;
import org.apache.iceberg.rest.requests.ReportMetricsRequest;
import org.apache.iceberg.rest.requests.UpdateNamespacePropertiesRequest;
import org.apache.iceberg.rest.requests.UpdateTableRequest;
import org.apache.iceberg.rest.responses.ConfigResponse;
import org.apache.iceberg.rest.responses.ErrorResponse;
import org.apache.iceberg.rest.responses.ErrorResponseParser;
import org.apache.iceberg.rest.responses.OAuthTokenResponse;

/**
 * An Apache Iceberg REST catalog server for tests: the routes of the REST API (version 1) on the
 * JDK's HTTP server, each handled by iceberg-core's own {@link CatalogHandlers} over a {@link
 * JdbcCatalog} (a SQLite file), the requests and responses (de)serialized by {@link
 * RESTSerializers}.
 *
 * <p>Usage: {@code java -cp ... IcebergRestServer SETTINGS}, where SETTINGS is a properties file:
 * the keys {@code server.host}, {@code server.port} (0: a free port) and {@code server.port-file}
 * (where the bound port is written once the server answers) belong to the server, every other key
 * is a property of the JdbcCatalog ({@code uri}, {@code warehouse}, {@code io-impl}, ...). Without
 * {@code io-impl} the warehouse is written by {@link LocalFileIO} on the local file system.
 *
 * <p>The environment variable {@code MONGOCDC_ICEBERG_CREDENTIAL} ({@code client_id:client_secret})
 * turns on OAuth2: {@code POST /v1/oauth/tokens} gives a bearer token for those client credentials
 * (grant type client_credentials, or a token exchange of a token it gave), and every other route
 * answers 401 without one.
 *
 * <p>Commits of tables (one table, or many in {@code POST /v1/transactions/commit}) run one at a
 * time: a transaction's requirements are checked on every table before any of them is committed.
 */
public final class IcebergRestServer {
  static final String CREDENTIAL_ENV = "MONGOCDC_ICEBERG_CREDENTIAL";
  static final String NAMESPACE_SEPARATOR = "%1F";
  static final int TOKEN_SECONDS = 3600;

  static final List<Endpoint> ENDPOINTS =
      List.of(
          Endpoint.V1_LIST_NAMESPACES,
          Endpoint.V1_LOAD_NAMESPACE,
          Endpoint.V1_NAMESPACE_EXISTS,
          Endpoint.V1_CREATE_NAMESPACE,
          Endpoint.V1_UPDATE_NAMESPACE,
          Endpoint.V1_DELETE_NAMESPACE,
          Endpoint.V1_COMMIT_TRANSACTION,
          Endpoint.V1_LIST_TABLES,
          Endpoint.V1_LOAD_TABLE,
          Endpoint.V1_TABLE_EXISTS,
          Endpoint.V1_CREATE_TABLE,
          Endpoint.V1_UPDATE_TABLE,
          Endpoint.V1_DELETE_TABLE,
          Endpoint.V1_RENAME_TABLE,
          Endpoint.V1_REGISTER_TABLE,
          Endpoint.V1_REPORT_METRICS,
          Endpoint.V1_LIST_VIEWS,
          Endpoint.V1_LOAD_VIEW,
          Endpoint.V1_VIEW_EXISTS,
          Endpoint.V1_CREATE_VIEW,
          Endpoint.V1_UPDATE_VIEW,
          Endpoint.V1_DELETE_VIEW,
          Endpoint.V1_RENAME_VIEW,
          Endpoint.V1_REGISTER_VIEW);

  private final JdbcCatalog catalog;
  private final ObjectMapper mapper;
  private final String clientId;
  private final byte[] clientSecret;
  private final Set<String> tokens = ConcurrentHashMap.newKeySet();
  private final SecureRandom random = new SecureRandom();
  private final Object commitLock = new Object();

  IcebergRestServer(JdbcCatalog catalog, String credential) {
    this.catalog = catalog;
    this.mapper = new ObjectMapper();
    mapper.setVisibility(PropertyAccessor.FIELD, JsonAutoDetect.Visibility.ANY);
    mapper.configure(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES, false);
    mapper.setPropertyNamingStrategy(new PropertyNamingStrategies.KebabCaseStrategy());
    RESTSerializers.registerAll(mapper);
    if (credential == null || credential.isEmpty()) {
      this.clientId = null;
      this.clientSecret = null;
    } else {
      int colon = credential.indexOf(':');
      if (colon < 0) {
        throw new IllegalArgumentException(
            CREDENTIAL_ENV + " must be client_id:client_secret (it has no ':')");
      }
      this.clientId = credential.substring(0, colon);
      this.clientSecret = credential.substring(colon + 1).getBytes(StandardCharsets.UTF_8);
    }
  }

  /** What one request answers: an HTTP status and a JSON body (null: none). */
  private static final class Reply {
    final int status;
    final String body;

    Reply(int status, String body) {
      this.status = status;
      this.body = body;
    }
  }

  private static final class HttpError extends RuntimeException {
    final int status;
    final String type;

    HttpError(int status, String type, String message) {
      super(message);
      this.status = status;
      this.type = type;
    }
  }

  void handle(HttpExchange exchange) throws IOException {
    String method = exchange.getRequestMethod().toUpperCase(Locale.ROOT);
    String path = exchange.getRequestURI().getRawPath();
    Reply reply;
    try {
      byte[] body;
      try (InputStream in = exchange.getRequestBody()) {
        body = in.readAllBytes();
      }
      reply = route(exchange, method, path, new String(body, StandardCharsets.UTF_8));
    } catch (RuntimeException | JsonProcessingException error) {
      reply = errorReply(error);
    }
    byte[] out = reply.body == null ? null : reply.body.getBytes(StandardCharsets.UTF_8);
    if (out != null) {
      exchange.getResponseHeaders().set("Content-Type", "application/json");
    }
    boolean noBody = out == null || "HEAD".equals(method) || reply.status == 204;
    exchange.sendResponseHeaders(reply.status, noBody ? -1 : out.length);
    if (!noBody) {
      try (OutputStream stream = exchange.getResponseBody()) {
        stream.write(out);
      }
    }
    exchange.close();
    System.out.printf("%s %s %d%n", method, path, reply.status);
  }

  private Reply route(HttpExchange exchange, String method, String rawPath, String body)
      throws JsonProcessingException {
    List<String> parts = new ArrayList<>();
    for (String part : rawPath.split("/")) {
      if (!part.isEmpty()) {
        parts.add(part);
      }
    }
    if (parts.isEmpty() || !"v1".equals(parts.get(0))) {
      throw new HttpError(404, "NotFoundException", "No route for " + method + " " + rawPath);
    }
    List<String> p = parts.subList(1, parts.size());
    Map<String, String> query = query(exchange.getRequestURI().getRawQuery());

    if (p.equals(List.of("oauth", "tokens")) && "POST".equals(method)) {
      return token(exchange, body);
    }
    authorize(exchange);

    int n = p.size();
    String first = n > 0 ? p.get(0) : "";
    if (n == 1 && "config".equals(first) && "GET".equals(method)) {
      return json(ConfigResponse.builder().withEndpoints(ENDPOINTS).build());
    }
    if (n == 2 && "tables".equals(first) && "rename".equals(p.get(1)) && "POST".equals(method)) {
      RenameTableRequest request = mapper.readValue(body, RenameTableRequest.class);
      synchronized (commitLock) {
        CatalogHandlers.renameTable(catalog, request);
      }
      return noContent();
    }
    if (n == 2 && "views".equals(first) && "rename".equals(p.get(1)) && "POST".equals(method)) {
      CatalogHandlers.renameView(catalog, mapper.readValue(body, RenameTableRequest.class));
      return noContent();
    }
    if (n == 2
        && "transactions".equals(first)
        && "commit".equals(p.get(1))
        && "POST".equals(method)) {
      commitTransaction(mapper.readValue(body, CommitTransactionRequest.class));
      return noContent();
    }
    if (!"namespaces".equals(first)) {
      throw new HttpError(404, "NotFoundException", "No route for " + method + " " + rawPath);
    }
    if (n == 1) {
      if ("GET".equals(method)) {
        Namespace parent =
            query.containsKey("parent")
                ? RESTUtil.namespaceFromQueryParam(query.get("parent"))
                : Namespace.empty();
        if (query.containsKey("pageSize")) {
          return json(
              CatalogHandlers.listNamespaces(
                  catalog, parent, query.get("pageToken"), query.get("pageSize")));
        }
        return json(CatalogHandlers.listNamespaces(catalog, parent));
      }
      if ("POST".equals(method)) {
        return json(
            CatalogHandlers.createNamespace(
                catalog, mapper.readValue(body, CreateNamespaceRequest.class)));
      }
      throw methodNotAllowed(method, rawPath);
    }
    Namespace namespace = RESTUtil.decodeNamespace(p.get(1), NAMESPACE_SEPARATOR);
    if (n == 2) {
      switch (method) {
        case "GET":
          return json(CatalogHandlers.loadNamespace(catalog, namespace));
        case "HEAD":
          CatalogHandlers.namespaceExists(catalog, namespace);
          return noContent();
        case "DELETE":
          CatalogHandlers.dropNamespace(catalog, namespace);
          return noContent();
        default:
          throw methodNotAllowed(method, rawPath);
      }
    }
    String collection = p.get(2);
    if (n == 3) {
      if ("properties".equals(collection) && "POST".equals(method)) {
        UpdateNamespacePropertiesRequest request =
            mapper.readValue(body, UpdateNamespacePropertiesRequest.class);
        return json(CatalogHandlers.updateNamespaceProperties(catalog, namespace, request));
      }
      if ("register".equals(collection) && "POST".equals(method)) {
        RegisterTableRequest request = mapper.readValue(body, RegisterTableRequest.class);
        synchronized (commitLock) {
          return json(CatalogHandlers.registerTable(catalog, namespace, request));
        }
      }
      if ("register-view".equals(collection) && "POST".equals(method)) {
        RegisterViewRequest request = mapper.readValue(body, RegisterViewRequest.class);
        return json(CatalogHandlers.registerView(catalog, namespace, request));
      }
      if ("tables".equals(collection) || "views".equals(collection)) {
        boolean views = "views".equals(collection);
        if ("GET".equals(method)) {
          if (query.containsKey("pageSize")) {
            String token = query.get("pageToken");
            String size = query.get("pageSize");
            return json(
                views
                    ? CatalogHandlers.listViews(catalog, namespace, token, size)
                    : CatalogHandlers.listTables(catalog, namespace, token, size));
          }
          return json(
              views
                  ? CatalogHandlers.listViews(catalog, namespace)
                  : CatalogHandlers.listTables(catalog, namespace));
        }
        if ("POST".equals(method) && views) {
          CreateViewRequest request = mapper.readValue(body, CreateViewRequest.class);
          return json(CatalogHandlers.createView(catalog, namespace, request));
        }
        if ("POST".equals(method)) {
          CreateTableRequest request = mapper.readValue(body, CreateTableRequest.class);
          request.validate();
          if (request.stageCreate()) {
            return json(CatalogHandlers.stageTableCreate(catalog, namespace, request));
          }
          synchronized (commitLock) {
            return json(CatalogHandlers.createTable(catalog, namespace, request));
          }
        }
        throw methodNotAllowed(method, rawPath);
      }
    }
    if (n >= 4 && ("tables".equals(collection) || "views".equals(collection))) {
      TableIdentifier ident = TableIdentifier.of(namespace, RESTUtil.decodeString(p.get(3)));
      if ("views".equals(collection) && n == 4) {
        switch (method) {
          case "GET":
            return json(CatalogHandlers.loadView(catalog, ident));
          case "HEAD":
            CatalogHandlers.viewExists(catalog, ident);
            return noContent();
          case "POST":
            UpdateTableRequest request = mapper.readValue(body, UpdateTableRequest.class);
            return json(CatalogHandlers.updateView(catalog, ident, request));
          case "DELETE":
            CatalogHandlers.dropView(catalog, ident);
            return noContent();
          default:
            throw methodNotAllowed(method, rawPath);
        }
      }
      if ("tables".equals(collection) && n == 4) {
        switch (method) {
          case "GET":
            String mode =
                query.getOrDefault(
                    RESTCatalogProperties.SNAPSHOTS_QUERY_PARAMETER,
                    RESTCatalogProperties.SNAPSHOT_LOADING_MODE_DEFAULT.name());
            return json(
                CatalogHandlers.loadTable(
                    catalog,
                    ident,
                    RESTCatalogProperties.SnapshotMode.valueOf(mode.toUpperCase(Locale.ROOT))));
          case "HEAD":
            CatalogHandlers.tableExists(catalog, ident);
            return noContent();
          case "POST":
            UpdateTableRequest request = mapper.readValue(body, UpdateTableRequest.class);
            synchronized (commitLock) {
              return json(CatalogHandlers.updateTable(catalog, ident, request));
            }
          case "DELETE":
            synchronized (commitLock) {
              if (Boolean.parseBoolean(query.getOrDefault("purgeRequested", "false"))) {
                CatalogHandlers.purgeTable(catalog, ident);
              } else {
                CatalogHandlers.dropTable(catalog, ident);
              }
            }
            return noContent();
          default:
            throw methodNotAllowed(method, rawPath);
        }
      }
      if ("tables".equals(collection)
          && n == 5
          && "metrics".equals(p.get(4))
          && "POST".equals(method)) {
        mapper.readValue(body, ReportMetricsRequest.class);
        return noContent();
      }
    }
    throw new HttpError(404, "NotFoundException", "No route for " + method + " " + rawPath);
  }

  /**
   * Commits the changes of several tables: every table's requirements are checked against its
   * current metadata and its updates applied before any table is committed; the commits then run
   * under the lock that every other commit of this server takes, each still a compare-and-swap of
   * the table's metadata location in the catalog.
   */
  private void commitTransaction(CommitTransactionRequest request) {
    synchronized (commitLock) {
      List<TableOperations> operations = new ArrayList<>();
      List<TableMetadata> bases = new ArrayList<>();
      List<TableMetadata> updates = new ArrayList<>();
      for (UpdateTableRequest change : request.tableChanges()) {
        Table table = catalog.loadTable(change.identifier());
        if (!(table instanceof BaseTable)) {
          throw new IllegalStateException("Not a table of this catalog: " + change.identifier());
        }
        TableOperations ops = ((BaseTable) table).operations();
        TableMetadata base = ops.current();
        for (UpdateRequirement requirement : change.requirements()) {
          requirement.validate(base);
        }
        TableMetadata.Builder builder = TableMetadata.buildFrom(base);
        for (MetadataUpdate update : change.updates()) {
          update.applyTo(builder);
        }
        operations.add(ops);
        bases.add(base);
        updates.add(builder.build());
      }
      for (int i = 0; i < operations.size(); i++) {
        if (!updates.get(i).changes().isEmpty()) {
          operations.get(i).commit(bases.get(i), updates.get(i));
        }
      }
    }
  }

  private Reply token(HttpExchange exchange, String body) throws JsonProcessingException {
    Map<String, String> form = RESTUtil.decodeFormData(body);
    String grant = form.getOrDefault("grant_type", "");
    if ("client_credentials".equals(grant)) {
      String id = form.get("client_id");
      String secret = form.get("client_secret");
      String basic = exchange.getRequestHeaders().getFirst("Authorization");
      if (id == null && basic != null && basic.regionMatches(true, 0, "Basic ", 0, 6)) {
        String pair =
            new String(Base64.getDecoder().decode(basic.substring(6).trim()), StandardCharsets.UTF_8);
        int colon = pair.indexOf(':');
        id = colon < 0 ? pair : pair.substring(0, colon);
        secret = colon < 0 ? "" : pair.substring(colon + 1);
      }
      if (clientId != null && !(clientId.equals(id) && secretMatches(secret))) {
        return oauthError(401, "invalid_client", "Unknown client_id or wrong client_secret");
      }
      return issueToken();
    }
    if ("urn:ietf:params:oauth:grant-type:token-exchange".equals(grant)) {
      if (clientId != null && !tokens.contains(form.getOrDefault("subject_token", ""))) {
        return oauthError(401, "invalid_grant", "The subject_token is not a token of this server");
      }
      return issueToken();
    }
    return oauthError(400, "unsupported_grant_type", "Unsupported grant_type: " + grant);
  }

  private boolean secretMatches(String secret) {
    byte[] given = (secret == null ? "" : secret).getBytes(StandardCharsets.UTF_8);
    return MessageDigest.isEqual(given, clientSecret);
  }

  private Reply issueToken() throws JsonProcessingException {
    byte[] bytes = new byte[32];
    random.nextBytes(bytes);
    String token = Base64.getUrlEncoder().withoutPadding().encodeToString(bytes);
    tokens.add(token);
    return json(
        OAuthTokenResponse.builder()
            .withToken(token)
            .withTokenType("bearer")
            .withIssuedTokenType("urn:ietf:params:oauth:token-type:access_token")
            .setExpirationInSeconds(TOKEN_SECONDS)
            .build());
  }

  private Reply oauthError(int status, String error, String description)
      throws JsonProcessingException {
    Map<String, String> body = new LinkedHashMap<>();
    body.put("error", error);
    body.put("error_description", description);
    return new Reply(status, mapper.writeValueAsString(body));
  }

  private void authorize(HttpExchange exchange) {
    if (clientId == null) {
      return;
    }
    String header = exchange.getRequestHeaders().getFirst("Authorization");
    if (header == null || !header.regionMatches(true, 0, "Bearer ", 0, 7)) {
      throw new HttpError(
          401,
          "NotAuthorizedException",
          "Not authorized: this catalog needs a bearer token from POST /v1/oauth/tokens");
    }
    if (!tokens.contains(header.substring(7).trim())) {
      throw new HttpError(
          401, "NotAuthorizedException", "Not authorized: the bearer token is not valid");
    }
  }

  private static Map<String, String> query(String raw) {
    Map<String, String> result = new HashMap<>();
    if (raw == null || raw.isEmpty()) {
      return result;
    }
    for (String pair : raw.split("&")) {
      int eq = pair.indexOf('=');
      String key = eq < 0 ? pair : pair.substring(0, eq);
      String value = eq < 0 ? "" : pair.substring(eq + 1);
      result.put(RESTUtil.decodeString(key), RESTUtil.decodeString(value));
    }
    return result;
  }

  private Reply json(Object response) throws JsonProcessingException {
    return new Reply(200, mapper.writeValueAsString(response));
  }

  private static Reply noContent() {
    return new Reply(204, null);
  }

  private static HttpError methodNotAllowed(String method, String path) {
    return new HttpError(405, "MethodNotAllowedException", method + " is not served on " + path);
  }

  private static int status(Exception error) {
    if (error instanceof HttpError) {
      return ((HttpError) error).status;
    }
    if (error instanceof NoSuchNamespaceException
        || error instanceof NoSuchTableException
        || error instanceof NoSuchViewException
        || error instanceof NotFoundException) {
      return 404;
    }
    if (error instanceof AlreadyExistsException
        || error instanceof CommitFailedException
        || error instanceof NamespaceNotEmptyException) {
      return 409;
    }
    if (error instanceof NotAuthorizedException) {
      return 401;
    }
    if (error instanceof ForbiddenException) {
      return 403;
    }
    if (error instanceof ValidationException
        || error instanceof IllegalArgumentException
        || error instanceof JsonProcessingException) {
      return 400;
    }
    if (error instanceof UnsupportedOperationException) {
      return 406;
    }
    if (error instanceof CommitStateUnknownException) {
      return 500;
    }
    return 500;
  }

  private static Reply errorReply(Exception error) {
    int status = status(error);
    String type =
        error instanceof HttpError ? ((HttpError) error).type : error.getClass().getSimpleName();
    if (error instanceof JsonProcessingException) {
      type = "BadRequestException";
    }
    if (status >= 500) {
      error.printStackTrace();
    }
    ErrorResponse response =
        ErrorResponse.builder()
            .responseCode(status)
            .withType(type)
            .withMessage(String.valueOf(error.getMessage()))
            .build();
    return new Reply(status, ErrorResponseParser.toJson(response));
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: IcebergRestServer SETTINGS.properties");
      System.exit(2);
    }
    Properties settings = new Properties();
    try (InputStream in = Files.newInputStream(Paths.get(args[0]))) {
      settings.load(in);
    }
    Map<String, String> properties = new HashMap<>();
    for (String key : settings.stringPropertyNames()) {
      if (!key.startsWith("server.")) {
        properties.put(key, settings.getProperty(key));
      }
    }
    String host = settings.getProperty("server.host", "127.0.0.1");
    int port = Integer.parseInt(settings.getProperty("server.port", "0"));
    String portFile = settings.getProperty("server.port-file");

    String ioImpl = properties.get(CatalogProperties.FILE_IO_IMPL);
    JdbcCatalog catalog =
        new JdbcCatalog(
            props ->
                ioImpl == null ? new LocalFileIO() : CatalogUtil.loadFileIO(ioImpl, props, null),
            null,
            true);
    catalog.initialize(settings.getProperty("server.catalog-name", "rest"), properties);

    IcebergRestServer handler = new IcebergRestServer(catalog, System.getenv(CREDENTIAL_ENV));
    HttpServer server = HttpServer.create(new InetSocketAddress(InetAddress.getByName(host), port), 64);
    server.createContext("/", handler::handle);
    ExecutorService executor = Executors.newFixedThreadPool(4);
    server.setExecutor(executor);
    server.start();
    int bound = server.getAddress().getPort();
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  server.stop(0);
                  executor.shutdownNow();
                  catalog.close();
                }));
    System.out.printf(
        "Iceberg REST catalog on http://%s:%d (warehouse %s)%n",
        host, bound, properties.get("warehouse"));
    if (portFile != null) {
      Path target = Paths.get(portFile);
      Path tmp = target.resolveSibling(target.getFileName() + ".tmp");
      Files.writeString(tmp, Integer.toString(bound));
      Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    }
  }
}
