import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.nio.file.Path;
import java.nio.file.Paths;
import org.apache.iceberg.Files;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.io.PositionOutputStream;
import org.apache.iceberg.io.SeekableInputStream;

/**
 * The REST catalog server's FileIO for a warehouse on the local file system, without Hadoop: the
 * metadata files of the tables are read and written with iceberg-api's {@link Files} (plain
 * java.io). Locations are {@code file:} URIs ({@code file:/a/b} or {@code file:///a/b}) or absolute
 * paths; each file keeps the location it was asked for, so that the table metadata records the
 * URIs the clients (pyiceberg's PyArrowFileIO) read.
 */
public class LocalFileIO implements FileIO {

  public LocalFileIO() {}

  static File file(String location) {
    Path path = location.startsWith("file:") ? Paths.get(URI.create(location)) : Paths.get(location);
    return path.toFile();
  }

  @Override
  public InputFile newInputFile(String location) {
    return new Input(location);
  }

  @Override
  public OutputFile newOutputFile(String location) {
    return new Output(location);
  }

  @Override
  public void deleteFile(String location) {
    try {
      java.nio.file.Files.deleteIfExists(file(location).toPath());
    } catch (IOException error) {
      throw new UncheckedIOException("Cannot delete " + location, error);
    }
  }

  private static final class Input implements InputFile {
    private final String location;
    private final InputFile local;

    Input(String location) {
      this.location = location;
      this.local = Files.localInput(file(location));
    }

    @Override
    public long getLength() {
      return local.getLength();
    }

    @Override
    public SeekableInputStream newStream() {
      return local.newStream();
    }

    @Override
    public String location() {
      return location;
    }

    @Override
    public boolean exists() {
      return local.exists();
    }
  }

  private static final class Output implements OutputFile {
    private final String location;
    private final OutputFile local;

    Output(String location) {
      this.location = location;
      this.local = Files.localOutput(file(location));
    }

    @Override
    public PositionOutputStream create() {
      return local.create();
    }

    @Override
    public PositionOutputStream createOrOverwrite() {
      return local.createOrOverwrite();
    }

    @Override
    public String location() {
      return location;
    }

    @Override
    public InputFile toInputFile() {
      return new Input(location);
    }
  }
}
