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

import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;
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
                if (kind.equals("document")) {
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
