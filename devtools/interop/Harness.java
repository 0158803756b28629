/*
 * Reads requests as JSON lines on stdin and answers each with one JSON line on stdout, using the
 * consumer-side code of a Debezium pipeline: Kafka Connect's JsonConverter (schemas.enable=true),
 * Debezium's ExtractNewDocumentState SMT and Debezium's JsonSerialization (the MongoDB connector's
 * key and value text). One JVM serves every request of a test session.
 *
 * {"id": 1, "kind": "record", "topic": "t", "key": "<base64>|null", "value": "<base64>|null",
 *  "smt": {"delete.tombstone.handling.mode": "rewrite", ...}}
 *   -> {"id": 1, "ok": true, "key": <key re-serialized by JsonConverter>, "value": <value re-serialized>,
 *       "smt": {"dropped": false, "topic": "t", "key": <JSON>, "value": <JSON or null>}}
 * {"id": 2, "kind": "document", "bson": "<base64 of a BSON document with _id>"}
 *   -> {"id": 2, "ok": true, "key": "<JsonSerialization.getDocumentId>", "value": "<getDocumentValue>",
 *       "toJson": "<BsonDocument.toJson()>", "relaxed": "...", "canonical": "..."}
 *   (relaxed and canonical: the document in JsonMode.RELAXED and EXTENDED with Debezium's compact
 *   layout, indent "" and no new lines)
 * {"id": 3, "kind": "emit", "connector": {"topic.prefix": "shop", ...},
 *  "read": {"db": "d", "collection": "c", "bson": "<base64 document>", "last": false}}
 * {"id": 4, "kind": "emit", "connector": {...}, "change": "<base64 of a change stream document>"}
 *   -> {"id": 3, "ok": true, "records": [{"topic": "shop.d.c", "key": <JSON>, "value": <JSON or null>,
 *       "headers": [["<name>", "<base64 of the header's bytes>"], ...]}, ...]}
 *   The records Debezium's MongoDB connector (configured with "connector", one instance per
 *   distinct configuration, so one run id) sends for a snapshot read of the document (its
 *   snapshot offset as MongoDbSnapshotChangeEventSource sets it: the stream's resume token
 *   without a cluster time; "last": the snapshot's final record) or for the change stream
 *   document (MongoDbChangeRecordEmitter, and the tombstone after a delete): built by Debezium's
 *   record emitters, with the headers of EventDispatcher (DebeziumHeaderProducer's context
 *   headers when extended.headers.enabled), converted as a Kafka Connect worker does with
 *   JsonConverter (schemas.enable=true) and SimpleHeaderConverter.
 * Any failure answers {"id": n, "ok": false, "error": "<class>: <message>", "stage": "..."}.
 */
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.ArrayList;
import java.util.List;
import java.lang.reflect.Proxy;
import java.time.Instant;

import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.header.ConnectHeaders;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;
import org.bson.BsonDocumentReader;
import org.bson.BsonString;
import org.bson.codecs.DecoderContext;
import com.mongodb.MongoClientSettings;
import com.mongodb.client.MongoChangeStreamCursor;
import com.mongodb.client.model.changestream.ChangeStreamDocument;
import io.debezium.config.Configuration;
import io.debezium.connector.SnapshotRecord;
import io.debezium.connector.common.DebeziumHeaderProducer;
import io.debezium.connector.mongodb.CollectionId;
import io.debezium.connector.mongodb.MongoDbConnectorConfig;
import io.debezium.connector.mongodb.MongoDbOffsetContext;
import io.debezium.connector.mongodb.MongoDbPartition;
import io.debezium.connector.mongodb.MongoDbSchema;
import io.debezium.connector.mongodb.MongoDbTaskContext;
import io.debezium.connector.mongodb.recordemitter.MongoDbChangeRecordEmitter;
import io.debezium.connector.mongodb.recordemitter.MongoDbSnapshotRecordEmitter;
import io.debezium.data.Envelope;
import io.debezium.pipeline.spi.ChangeRecordEmitter;
import io.debezium.pipeline.spi.OffsetContext;
import io.debezium.schema.DataCollectionSchema;
import io.debezium.util.Clock;
import org.bson.BsonDocument;
import org.bson.RawBsonDocument;
import org.bson.codecs.BsonDocumentCodec;
import org.bson.json.JsonMode;
import org.bson.json.JsonWriterSettings;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import io.debezium.connector.mongodb.transforms.ExtractNewDocumentState;

public class Harness {
    private static final ObjectMapper MAPPER = new ObjectMapper();

    public static void main(String[] args) throws Exception {
        JsonConverter keyConverter = new JsonConverter();
        keyConverter.configure(Map.of("schemas.enable", "true"), true);
        JsonConverter valueConverter = new JsonConverter();
        valueConverter.configure(Map.of("schemas.enable", "true"), false);
        Map<String, ExtractNewDocumentState<SourceRecord>> smts = new HashMap<>();
        Map<String, Connector> connectors = new HashMap<>();

        Class<?> serializationClass = Class.forName("io.debezium.connector.mongodb.JsonSerialization");
        Constructor<?> constructor = serializationClass.getDeclaredConstructor();
        constructor.setAccessible(true);
        Object serialization = constructor.newInstance();
        Method documentId = serializationClass.getDeclaredMethod("getDocumentId", BsonDocument.class);
        documentId.setAccessible(true);
        Method documentValue = serializationClass.getDeclaredMethod("getDocumentValue", BsonDocument.class);
        documentValue.setAccessible(true);

        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        out.println("{\"ready\": true}");
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            JsonNode request = MAPPER.readTree(line);
            ObjectNode answer = MAPPER.createObjectNode();
            answer.set("id", request.get("id"));
            String stage = "request";
            try {
                String kind = request.get("kind").asText();
                if (kind.equals("emit")) {
                    stage = "emit";
                    answer.set("records", emit(request, connectors, keyConverter, valueConverter));
                }
                else if (kind.equals("document")) {
                    stage = "decode";
                    BsonDocument document = new RawBsonDocument(bytes(request.get("bson"))).decode(
                            new BsonDocumentCodec());
                    stage = "getDocumentId";
                    answer.put("key", (String) invoke(documentId, serialization, document));
                    stage = "getDocumentValue";
                    answer.put("value", (String) invoke(documentValue, serialization, document));
                    stage = "toJson";
                    answer.put("toJson", document.toJson());
                    answer.put("relaxed", document.toJson(compact(JsonMode.RELAXED)));
                    answer.put("canonical", document.toJson(compact(JsonMode.EXTENDED)));
                }
                else {
                    String topic = request.get("topic").asText();
                    byte[] key = bytes(request.get("key"));
                    byte[] value = bytes(request.get("value"));
                    stage = "JsonConverter.toConnectData(key)";
                    SchemaAndValue connectKey = keyConverter.toConnectData(topic, key);
                    stage = "JsonConverter.toConnectData(value)";
                    SchemaAndValue connectValue = valueConverter.toConnectData(topic, value);
                    stage = "JsonConverter.fromConnectData(key)";
                    answer.set("key", json(keyConverter.fromConnectData(topic, connectKey.schema(), connectKey.value())));
                    stage = "JsonConverter.fromConnectData(value)";
                    answer.set("value",
                            json(valueConverter.fromConnectData(topic, connectValue.schema(), connectValue.value())));
                    JsonNode smtConfig = request.get("smt");
                    if (smtConfig != null && !smtConfig.isNull()) {
                        stage = "ExtractNewDocumentState.configure";
                        ExtractNewDocumentState<SourceRecord> smt = smts.get(smtConfig.toString());
                        if (smt == null) {
                            smt = new ExtractNewDocumentState<>();
                            Map<String, String> config = new HashMap<>();
                            Iterator<Map.Entry<String, JsonNode>> fields = smtConfig.fields();
                            while (fields.hasNext()) {
                                Map.Entry<String, JsonNode> field = fields.next();
                                config.put(field.getKey(), field.getValue().asText());
                            }
                            smt.configure(config);
                            smts.put(smtConfig.toString(), smt);
                        }
                        SourceRecord record = new SourceRecord(null, null, topic, null, connectKey.schema(),
                                connectKey.value(), connectValue.schema(), connectValue.value());
                        stage = "ExtractNewDocumentState.apply";
                        SourceRecord result = smt.apply(record);
                        ObjectNode smtAnswer = MAPPER.createObjectNode();
                        smtAnswer.put("dropped", result == null);
                        if (result != null) {
                            smtAnswer.put("topic", result.topic());
                            stage = "JsonConverter.fromConnectData(SMT key)";
                            smtAnswer.set("key", json(keyConverter.fromConnectData(result.topic(), result.keySchema(),
                                    result.key())));
                            stage = "JsonConverter.fromConnectData(SMT value)";
                            smtAnswer.set("value", json(valueConverter.fromConnectData(result.topic(),
                                    result.valueSchema(), result.value())));
                        }
                        answer.set("smt", smtAnswer);
                    }
                }
                answer.put("ok", true);
            }
            catch (Throwable error) {
                answer.put("ok", false);
                answer.put("stage", stage);
                answer.put("error", error.getClass().getName() + ": " + error.getMessage());
            }
            out.println(MAPPER.writeValueAsString(answer));
        }
    }

    /** One Debezium MongoDB connector task's objects for a configuration (its run id among them). */
    private static final class Connector {
        final MongoDbConnectorConfig config;
        final MongoDbTaskContext taskContext;
        final MongoDbSchema schema;
        final DebeziumHeaderProducer headers;
        final MongoDbPartition partition;
        final io.debezium.spi.topic.TopicNamingStrategy<CollectionId> topics;

        Connector(JsonNode properties) {
            Configuration.Builder builder = Configuration.create()
                    .with("mongodb.connection.string", "mongodb://localhost:27017/?replicaSet=rs0");
            Iterator<Map.Entry<String, JsonNode>> fields = properties.fields();
            while (fields.hasNext()) {
                Map.Entry<String, JsonNode> field = fields.next();
                builder.with(field.getKey(), field.getValue().asText());
            }
            Configuration raw = builder.build();
            config = new MongoDbConnectorConfig(raw);
            taskContext = new MongoDbTaskContext(raw);
            Schema sourceSchema = config.getSourceInfoStructMaker().schema();
            // As MongoDbConnectorTask.start does.
            topics = config.getTopicNamingStrategy(MongoDbConnectorConfig.TOPIC_NAMING_STRATEGY);
            schema = new MongoDbSchema(config, taskContext, topics, sourceSchema, config.schemaNameAdjuster());
            headers = new DebeziumHeaderProducer(taskContext);
            partition = new MongoDbPartition(config.getLogicalName());
        }

        /** EventDispatcher.getExtendedHeaders: the emitter's headers (none) and the context headers. */
        ConnectHeaders extendedHeaders() {
            ConnectHeaders extended = new ConnectHeaders();
            if (config.isExtendedHeadersEnabled()) {
                headers.contextHeaders().forEach(extended::add);
            }
            return extended;
        }
    }

    /** A change stream cursor that has no change yet: MongoDbSnapshotChangeEventSource's initEvent then
     * records the cursor's resume token alone (SourceInfo.noEvent). */
    @SuppressWarnings("unchecked")
    private static MongoChangeStreamCursor<ChangeStreamDocument<BsonDocument>> quietCursor() {
        BsonDocument token = new BsonDocument("_data", new BsonString("8263515EAC000000022B0429296E1404"));
        return (MongoChangeStreamCursor<ChangeStreamDocument<BsonDocument>>) Proxy.newProxyInstance(
                Harness.class.getClassLoader(), new Class<?>[]{ MongoChangeStreamCursor.class },
                (proxy, method, arguments) -> {
                    switch (method.getName()) {
                        case "getResumeToken":
                            return token;
                        case "tryNext":
                            return null;
                        case "hashCode":
                            return 0;
                        case "equals":
                            return proxy == arguments[0];
                        case "toString":
                            return "quiet change stream cursor";
                        default:
                            return null;
                    }
                });
    }

    private static JsonNode emit(JsonNode request, Map<String, Connector> connectors, JsonConverter keyConverter,
                                 JsonConverter valueConverter)
            throws Exception {
        JsonNode properties = request.get("connector");
        Connector connector = connectors.computeIfAbsent(properties.toString(), ignored -> new Connector(properties));
        MongoDbOffsetContext offset = MongoDbOffsetContext.empty(connector.config);
        ChangeRecordEmitter<MongoDbPartition> emitter;
        CollectionId collectionId;
        boolean last = false;
        JsonNode read = request.get("read");
        if (read != null && !read.isNull()) {
            // MongoDbSnapshotChangeEventSource: initSnapshotStartOffsets, startInitialSnapshot, readEvent.
            offset.initEvent(quietCursor());
            Method start = MongoDbOffsetContext.class.getDeclaredMethod("startInitialSnapshot");
            start.setAccessible(true);
            start.invoke(offset);
            collectionId = CollectionId.parse(read.get("db").asText() + "." + read.get("collection").asText());
            offset.readEvent(collectionId, Instant.now());
            BsonDocument document = new RawBsonDocument(bytes(read.get("bson"))).decode(new BsonDocumentCodec());
            emitter = new MongoDbSnapshotRecordEmitter(connector.partition, offset, Clock.system(), document,
                    connector.config);
            last = read.path("last").asBoolean(false);
        }
        else {
            BsonDocument raw = new RawBsonDocument(bytes(request.get("change"))).decode(new BsonDocumentCodec());
            ChangeStreamDocument<BsonDocument> change = ChangeStreamDocument
                    .createCodec(BsonDocument.class, MongoClientSettings.getDefaultCodecRegistry())
                    .decode(new BsonDocumentReader(raw), DecoderContext.builder().build());
            offset.changeStreamEvent(change);
            collectionId = CollectionId.parse(change.getNamespace().getFullName());
            emitter = new MongoDbChangeRecordEmitter(connector.partition, offset, Clock.system(), change,
                    connector.config);
        }
        DataCollectionSchema schema = connector.schema.schemaFor(collectionId);
        List<SourceRecord> records = new ArrayList<>();
        final boolean lastRecord = last;
        emitter.emitChangeRecords(schema, new ChangeRecordEmitter.Receiver<MongoDbPartition>() {
            @Override
            public void changeRecord(MongoDbPartition partition, DataCollectionSchema collectionSchema,
                                     Envelope.Operation operation, Object key, Struct value, OffsetContext offsetContext,
                                     ConnectHeaders headers) {
                if (lastRecord) {
                    // BufferingSnapshotChangeRecordReceiver.completeSnapshot
                    SnapshotRecord.LAST.toSource(value.getStruct(Envelope.FieldName.SOURCE));
                }
                String topic = connector.topics.dataChangeTopic((CollectionId) collectionSchema.id());
                SourceRecord record = new SourceRecord(partition.getSourcePartition(), offsetContext.getOffset(), topic,
                        null, collectionSchema.keySchema(), key, collectionSchema.getEnvelopeSchema().schema(), value,
                        null, connector.extendedHeaders());
                records.add(record);
                if (operation == Envelope.Operation.DELETE && connector.config.isEmitTombstoneOnDelete()) {
                    records.add(record.newRecord(record.topic(), record.kafkaPartition(), record.keySchema(),
                            record.key(), null, null, record.timestamp(), record.headers()));
                }
            }
        });
        SimpleHeaderConverter headerConverter = new SimpleHeaderConverter();
        headerConverter.configure(Map.of());
        com.fasterxml.jackson.databind.node.ArrayNode out = MAPPER.createArrayNode();
        for (SourceRecord record : records) {
            ObjectNode item = MAPPER.createObjectNode();
            item.put("topic", record.topic());
            item.set("key", json(keyConverter.fromConnectData(record.topic(), record.keySchema(), record.key())));
            item.set("value", json(valueConverter.fromConnectData(record.topic(), record.valueSchema(), record.value())));
            com.fasterxml.jackson.databind.node.ArrayNode headerList = MAPPER.createArrayNode();
            for (Header header : record.headers()) {
                byte[] data = headerConverter.fromConnectHeader(record.topic(), header.key(), header.schema(),
                        header.value());
                headerList.add(MAPPER.createArrayNode().add(header.key())
                        .add(data == null ? null : Base64.getEncoder().encodeToString(data)));
            }
            item.set("headers", headerList);
            out.add(item);
        }
        return out;
    }

    private static Object invoke(Method method, Object target, Object argument) throws Throwable {
        try {
            return method.invoke(target, argument);
        }
        catch (java.lang.reflect.InvocationTargetException error) {
            throw error.getCause();
        }
    }

    private static JsonWriterSettings compact(JsonMode mode) {
        return JsonWriterSettings.builder().outputMode(mode).indent(true).indentCharacters("").newLineCharacters("")
                .build();
    }

    private static byte[] bytes(JsonNode node) {
        return node == null || node.isNull() ? null : Base64.getDecoder().decode(node.asText());
    }

    private static JsonNode json(byte[] data) throws Exception {
        return data == null ? null : MAPPER.readTree(data);
    }
}
